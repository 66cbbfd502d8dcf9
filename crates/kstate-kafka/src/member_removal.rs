//! Removing members from a consumer group on their behalf: the `LeaveGroup` request (v3) that
//! Kafka's admin `removeMembersFromConsumerGroup` sends (KIP-345), sent by a process other than
//! the member.
//!
//! Why: a static member that crashes never leaves its group, so its partitions move only when
//! the broker's session timeout expires (6 s at the least on the classic protocol, 45 s on
//! KIP-848). A process that knows, sooner, that another has died (the task runtime's liveness
//! beacons) removes that process's members itself, and the group rebalances at once.
//!
//! Why by hand: librdkafka has no such admin call, so this speaks the two requests it needs
//! (`FindCoordinator` v2, `LeaveGroup` v3: neither is a flexible version) over a plain TCP
//! connection. It therefore works on `PLAINTEXT` listeners only; other security protocols get
//! [`MemberRemovalError::Unsupported`] before anything is sent.
//!
//! Why it is safe: each member is named by its member id *and* its `group.instance.id`. The
//! coordinator removes a static member only while that instance id still has that member id,
//! so a process that restarted in the meantime (same instance id, new member id) is not
//! removed: its entry comes back [`MemberRemoved::Fenced`].
//!
//! Why it trusts nothing it reads: the answer comes from whatever listens at the address a
//! bootstrap broker named. A count is believed only as far as the bytes that remain can hold
//! it (no allocation follows a number from the wire), and the whole call, name resolution and
//! every read included, ends at the caller's deadline, however slowly the peer sends.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::client_properties::ClientProperties;
use crate::error::MemberRemovalError;

const FIND_COORDINATOR: i16 = 10;
const FIND_COORDINATOR_VERSION: i16 = 2;
const LEAVE_GROUP: i16 = 13;
const LEAVE_GROUP_VERSION: i16 = 3;
/// `FindCoordinator`'s key type for a consumer group.
const GROUP_KEY: i8 = 0;
/// The largest answer read (the broker's answers here are a few hundred bytes).
const MAX_RESPONSE: usize = 1 << 20;

/// Kafka's error codes that this module tells apart.
mod code {
    pub const NONE: i16 = 0;
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const NOT_COORDINATOR: i16 = 16;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const FENCED_INSTANCE_ID: i16 = 82;
}

/// A member to remove: its member id, and its `group.instance.id` when it is static.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberToRemove {
    /// The member id the coordinator gave it (as DescribeGroups shows it).
    pub member_id: String,
    /// Its `group.instance.id`, if it is a static member.
    pub group_instance_id: Option<String>,
}

/// What the coordinator did with one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberRemoved {
    /// It was removed; the group rebalances.
    Removed,
    /// The group has no such member (it left, or was removed already).
    Unknown,
    /// Its instance id now belongs to another member id: it came back, and is left alone.
    Fenced,
    /// Another error, by Kafka's code.
    Refused(i16),
}

impl MemberRemoved {
    fn from_code(code: i16) -> Self {
        match code {
            code::NONE => MemberRemoved::Removed,
            code::UNKNOWN_MEMBER_ID => MemberRemoved::Unknown,
            code::FENCED_INSTANCE_ID => MemberRemoved::Fenced,
            other => MemberRemoved::Refused(other),
        }
    }
}

/// Removes `members` from consumer group `group`, asking its coordinator, within `timeout`.
/// Returns each member's outcome, in the coordinator's order.
pub fn remove_group_members(
    client: &ClientProperties,
    group: &str,
    members: &[MemberToRemove],
    timeout: Duration,
) -> Result<Vec<(MemberToRemove, MemberRemoved)>, MemberRemovalError> {
    let protocol = client.get("security.protocol").unwrap_or("plaintext");
    if !protocol.eq_ignore_ascii_case("plaintext") {
        return Err(MemberRemovalError::Unsupported {
            group: group.to_string(),
            protocol: protocol.to_string(),
        });
    }
    let deadline = Instant::now() + timeout;
    let mut last: Option<MemberRemovalError> = None;
    // The coordinator may move or still be loading: find it again, until the deadline.
    while Instant::now() < deadline {
        let attempt = find_coordinator(client, group, deadline)
            .and_then(|coordinator| leave_group(&coordinator, group, members, deadline));
        match attempt {
            Ok(outcomes) => return Ok(outcomes),
            Err(e) if e.is_retriable() => {
                tracing::debug!(error = %e, "removing group members: trying again");
                last = Some(e);
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or(MemberRemovalError::Timeout {
        group: group.to_string(),
        timeout,
    }))
}

/// The group's coordinator, `host:port`, asked of the bootstrap brokers in turn.
fn find_coordinator(
    client: &ClientProperties,
    group: &str,
    deadline: Instant,
) -> Result<String, MemberRemovalError> {
    let mut body = Vec::new();
    put_string(&mut body, group);
    body.push(GROUP_KEY as u8);
    let mut last = None;
    for broker in client
        .bootstrap_servers()
        .split(',')
        .map(|s| s.trim())
        .map(|s| s.rsplit("://").next().unwrap_or(s))
        .filter(|s| !s.is_empty())
    {
        let answer = match call(
            broker,
            group,
            FIND_COORDINATOR,
            FIND_COORDINATOR_VERSION,
            &body,
            deadline,
        ) {
            Ok(a) => a,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        let (error, host, port) =
            parse_find_coordinator(&answer).map_err(|problem| MemberRemovalError::Malformed {
                group: group.to_string(),
                broker: broker.to_string(),
                request: "FindCoordinator",
                problem: problem.to_string(),
            })?;
        if error != code::NONE {
            return Err(MemberRemovalError::Broker {
                group: group.to_string(),
                broker: broker.to_string(),
                request: "FindCoordinator",
                code: error,
            });
        }
        return Ok(format!("{host}:{port}"));
    }
    Err(last.unwrap_or(MemberRemovalError::NoBroker {
        group: group.to_string(),
        bootstrap_servers: client.bootstrap_servers().to_string(),
    }))
}

/// Sends `LeaveGroup` v3 for `members` to `coordinator`.
fn leave_group(
    coordinator: &str,
    group: &str,
    members: &[MemberToRemove],
    deadline: Instant,
) -> Result<Vec<(MemberToRemove, MemberRemoved)>, MemberRemovalError> {
    let mut body = Vec::new();
    put_string(&mut body, group);
    body.extend_from_slice(&(members.len() as i32).to_be_bytes());
    for m in members {
        put_string(&mut body, &m.member_id);
        match &m.group_instance_id {
            Some(id) => put_string(&mut body, id),
            None => body.extend_from_slice(&(-1i16).to_be_bytes()),
        }
    }
    let answer = call(
        coordinator,
        group,
        LEAVE_GROUP,
        LEAVE_GROUP_VERSION,
        &body,
        deadline,
    )?;
    match parse_leave_group(&answer) {
        Ok(LeaveGroupAnswer::Members(outcomes)) => Ok(outcomes),
        Ok(LeaveGroupAnswer::Refused(code)) => Err(MemberRemovalError::Broker {
            group: group.to_string(),
            broker: coordinator.to_string(),
            request: "LeaveGroup",
            code,
        }),
        Err(problem) => Err(MemberRemovalError::Malformed {
            group: group.to_string(),
            broker: coordinator.to_string(),
            request: "LeaveGroup",
            problem,
        }),
    }
}

/// The fewest bytes one member takes in a `LeaveGroup` answer: an empty member id (2), a null
/// instance id (2) and an error code (2).
const MIN_MEMBER_BYTES: usize = 6;

/// A `LeaveGroup` answer's body.
#[derive(Debug, PartialEq, Eq)]
enum LeaveGroupAnswer {
    Members(Vec<(MemberToRemove, MemberRemoved)>),
    /// The request as a whole was refused, with this code.
    Refused(i16),
}

/// Parses a `FindCoordinator` v2 answer's body: error code, host, port.
fn parse_find_coordinator(answer: &[u8]) -> Result<(i16, String, i32), &'static str> {
    let mut r = Reader::new(answer);
    let _throttle = r.i32().ok_or("no throttle time")?;
    let error = r.i16().ok_or("no error code")?;
    let _message = r.nullable_string().ok_or("no message")?;
    let _node = r.i32().ok_or("no node id")?;
    let host = r.string().ok_or("no host")?;
    let port = r.i32().ok_or("no port")?;
    Ok((error, host, port))
}

/// Parses a `LeaveGroup` v3 answer's body. Its member count is believed only as far as the
/// bytes that remain can hold that many members.
fn parse_leave_group(answer: &[u8]) -> Result<LeaveGroupAnswer, String> {
    let mut r = Reader::new(answer);
    let _throttle = r.i32().ok_or("no throttle time")?;
    let error = r.i16().ok_or("no error code")?;
    if error != code::NONE {
        return Ok(LeaveGroupAnswer::Refused(error));
    }
    let count = r.i32().ok_or("no member count")?;
    let count = usize::try_from(count).map_err(|_| format!("member count {count}"))?;
    if count > r.rest.len() / MIN_MEMBER_BYTES {
        return Err(format!(
            "member count {count} in {} remaining bytes",
            r.rest.len()
        ));
    }
    let mut outcomes = Vec::with_capacity(count);
    for _ in 0..count {
        let member_id = r.string().ok_or("no member id")?;
        let group_instance_id = r.nullable_string().ok_or("no instance id")?;
        let error = r.i16().ok_or("no member error code")?;
        outcomes.push((
            MemberToRemove {
                member_id,
                group_instance_id,
            },
            MemberRemoved::from_code(error),
        ));
    }
    Ok(LeaveGroupAnswer::Members(outcomes))
}

/// Resolves `broker` (`host:port`) to its first address, giving up at `deadline`: a resolver
/// that hangs is left to finish on a thread of its own.
fn resolve(broker: &str, deadline: Instant) -> std::io::Result<std::net::SocketAddr> {
    if let Ok(address) = broker.parse() {
        return Ok(address);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = broker.to_string();
    std::thread::Builder::new()
        .name("kstate-resolve".into())
        .spawn(move || {
            let first = name.to_socket_addrs().map(|mut addresses| addresses.next());
            let _ = tx.send(first);
        })?;
    let left = deadline.saturating_duration_since(Instant::now());
    match rx.recv_timeout(left) {
        Ok(Ok(Some(address))) => Ok(address),
        Ok(Ok(None)) => Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the address resolves to nothing",
        )),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "resolving the address took past the deadline",
        )),
    }
}

/// Fills `buf` from `stream`, giving up at `deadline` (not per read: a peer sending a byte at a
/// time cannot stretch it).
fn read_until(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the answer was not complete by the deadline ({filled} of {} bytes)",
                    buf.len()
                ),
            ));
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "the connection closed after {filled} of {} bytes",
                        buf.len()
                    ),
                ));
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One request and its answer's body (after the correlation id), on a connection of its own.
fn call(
    broker: &str,
    group: &str,
    api_key: i16,
    version: i16,
    body: &[u8],
    deadline: Instant,
) -> Result<Vec<u8>, MemberRemovalError> {
    let io = |source: std::io::Error| MemberRemovalError::Io {
        group: group.to_string(),
        broker: broker.to_string(),
        source,
    };
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let address = resolve(broker, deadline).map_err(io)?;
    let mut stream = TcpStream::connect_timeout(&address, left()).map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    stream.set_write_timeout(Some(left())).map_err(io)?;
    let correlation: i32 = 1;
    let client_id = "kstate-member-removal";
    let mut request = Vec::with_capacity(body.len() + 32);
    request.extend_from_slice(&api_key.to_be_bytes());
    request.extend_from_slice(&version.to_be_bytes());
    request.extend_from_slice(&correlation.to_be_bytes());
    put_string(&mut request, client_id);
    request.extend_from_slice(body);
    let mut framed = (request.len() as i32).to_be_bytes().to_vec();
    framed.extend_from_slice(&request);
    stream.write_all(&framed).map_err(io)?;
    let mut size = [0u8; 4];
    read_until(&mut stream, &mut size, deadline).map_err(io)?;
    let size = i32::from_be_bytes(size);
    let malformed = |problem: String| MemberRemovalError::Malformed {
        group: group.to_string(),
        broker: broker.to_string(),
        request: if api_key == LEAVE_GROUP {
            "LeaveGroup"
        } else {
            "FindCoordinator"
        },
        problem,
    };
    if size < 4 || size as usize > MAX_RESPONSE {
        return Err(malformed(format!("answer of {size} bytes")));
    }
    let mut answer = vec![0u8; size as usize];
    read_until(&mut stream, &mut answer, deadline).map_err(io)?;
    let got = i32::from_be_bytes([answer[0], answer[1], answer[2], answer[3]]);
    if got != correlation {
        return Err(malformed(format!(
            "correlation id {got}, sent {correlation}"
        )));
    }
    answer.drain(..4);
    Ok(answer)
}

/// Appends a Kafka `STRING` (i16 length, then the bytes).
fn put_string(out: &mut Vec<u8>, s: &str) {
    let len = i16::try_from(s.len()).unwrap_or(i16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&s.as_bytes()[..len as usize]);
}

/// Reads Kafka's big-endian fields; `None` when the answer ends too soon.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.rest.len() < n {
            return None;
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Some(head)
    }

    fn i16(&mut self) -> Option<i16> {
        self.take(2).map(|b| i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Option<i32> {
        self.take(4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn nullable_string(&mut self) -> Option<Option<String>> {
        let len = self.i16()?;
        if len < 0 {
            return Some(None);
        }
        let bytes = self.take(len as usize)?;
        Some(Some(String::from_utf8_lossy(bytes).into_owned()))
    }

    fn string(&mut self) -> Option<String> {
        self.nullable_string()?
    }
}

impl MemberRemovalError {
    /// Whether asking again (after finding the coordinator again) may succeed.
    fn is_retriable(&self) -> bool {
        match self {
            MemberRemovalError::Broker { code, .. } => matches!(
                *code,
                code::COORDINATOR_LOAD_IN_PROGRESS
                    | code::COORDINATOR_NOT_AVAILABLE
                    | code::NOT_COORDINATOR
            ),
            MemberRemovalError::Io { .. } => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_length_prefixed_and_read_back() {
        let mut out = Vec::new();
        put_string(&mut out, "app-copy-0");
        out.extend_from_slice(&(-1i16).to_be_bytes());
        assert_eq!(&out[..2], &[0, 10]);
        let mut r = Reader::new(&out);
        assert_eq!(r.string().as_deref(), Some("app-copy-0"));
        assert_eq!(r.nullable_string(), Some(None));
        assert_eq!(r.i16(), None, "the answer has ended");
    }

    #[test]
    fn other_security_protocols_are_refused_before_anything_is_sent() {
        let client = ClientProperties::new("127.0.0.1:1").set("security.protocol", "SASL_SSL");
        let members = [MemberToRemove {
            member_id: "m".into(),
            group_instance_id: Some("i".into()),
        }];
        let e = remove_group_members(&client, "g", &members, Duration::from_secs(1))
            .expect_err("refused");
        assert!(matches!(e, MemberRemovalError::Unsupported { .. }), "{e}");
        assert!(e.to_string().contains("SASL_SSL"), "{e}");
    }

    /// A peer on 127.0.0.1 that answers FindCoordinator with itself and LeaveGroup with
    /// `leave_group` (the whole frame after the size, correlation id included, is written
    /// by `answer`).
    fn hostile_coordinator(
        answer: impl Fn(&mut TcpStream) + Send + 'static,
    ) -> (String, std::thread::JoinHandle<()>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        let handle = std::thread::spawn(move || {
            for connection in listener.incoming().take(2) {
                let Ok(mut stream) = connection else { return };
                let mut size = [0u8; 4];
                if stream.read_exact(&mut size).is_err() {
                    return;
                }
                let mut request = vec![0u8; i32::from_be_bytes(size) as usize];
                if stream.read_exact(&mut request).is_err() {
                    return;
                }
                let api_key = i16::from_be_bytes([request[0], request[1]]);
                if api_key == FIND_COORDINATOR {
                    let mut body = 1i32.to_be_bytes().to_vec(); // correlation id
                    body.extend_from_slice(&0i32.to_be_bytes()); // throttle
                    body.extend_from_slice(&0i16.to_be_bytes()); // error
                    body.extend_from_slice(&(-1i16).to_be_bytes()); // message
                    body.extend_from_slice(&0i32.to_be_bytes()); // node
                    put_string(&mut body, "127.0.0.1");
                    body.extend_from_slice(&i32::from(address.port()).to_be_bytes());
                    let mut framed = (body.len() as i32).to_be_bytes().to_vec();
                    framed.extend_from_slice(&body);
                    let _ = stream.write_all(&framed);
                } else {
                    answer(&mut stream);
                }
            }
        });
        (address.to_string(), handle)
    }

    fn one_member() -> [MemberToRemove; 1] {
        [MemberToRemove {
            member_id: "m".into(),
            group_instance_id: Some("i".into()),
        }]
    }

    #[test]
    fn a_leave_group_answer_claiming_two_billion_members_is_malformed() {
        let (address, _peer) = hostile_coordinator(|stream| {
            let mut body = 1i32.to_be_bytes().to_vec();
            body.extend_from_slice(&0i32.to_be_bytes()); // throttle
            body.extend_from_slice(&0i16.to_be_bytes()); // error
            body.extend_from_slice(&i32::MAX.to_be_bytes()); // members
            let mut framed = (body.len() as i32).to_be_bytes().to_vec();
            framed.extend_from_slice(&body);
            let _ = stream.write_all(&framed);
        });
        let client = ClientProperties::new(address);
        let e = remove_group_members(&client, "g", &one_member(), Duration::from_secs(5))
            .expect_err("malformed");
        assert!(matches!(e, MemberRemovalError::Malformed { .. }), "{e}");
        assert!(e.to_string().contains("2147483647"), "{e}");
    }

    #[test]
    fn a_peer_sending_a_byte_at_a_time_cannot_hold_the_call_past_its_deadline() {
        let (address, _peer) = hostile_coordinator(|stream| {
            // A megabyte announced, then a byte every 100 ms: each read succeeds in time.
            let _ = stream.write_all(&(1i32 << 20).to_be_bytes());
            for _ in 0..100 {
                if stream.write_all(&[0]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let client = ClientProperties::new(address);
        let started = Instant::now();
        let outcome = remove_group_members(&client, "g", &one_member(), Duration::from_secs(1));
        let took = started.elapsed();
        assert!(outcome.is_err(), "{outcome:?}");
        assert!(
            took < Duration::from_secs(3),
            "a call with a 1 s deadline took {took:?}"
        );
    }

    proptest::proptest! {
        #[test]
        fn no_answer_makes_the_parsers_panic_or_allocate_past_its_size(
            answer in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
            count in proptest::prelude::any::<i32>(),
        ) {
            let _ = parse_find_coordinator(&answer);
            // The same bytes after a header that claims `count` members.
            let mut claimed = 0i32.to_be_bytes().to_vec();
            claimed.extend_from_slice(&0i16.to_be_bytes());
            claimed.extend_from_slice(&count.to_be_bytes());
            claimed.extend_from_slice(&answer);
            for bytes in [&answer[..], &claimed[..]] {
                if let Ok(LeaveGroupAnswer::Members(members)) = parse_leave_group(bytes) {
                    proptest::prop_assert!(members.len() <= bytes.len() / MIN_MEMBER_BYTES);
                }
            }
        }
    }

    #[test]
    fn member_outcomes_follow_kafkas_codes() {
        assert_eq!(MemberRemoved::from_code(0), MemberRemoved::Removed);
        assert_eq!(MemberRemoved::from_code(25), MemberRemoved::Unknown);
        assert_eq!(MemberRemoved::from_code(82), MemberRemoved::Fenced);
        assert_eq!(MemberRemoved::from_code(29), MemberRemoved::Refused(29));
    }
}
