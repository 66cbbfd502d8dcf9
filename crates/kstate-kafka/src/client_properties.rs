//! [`ClientProperties`]: how to reach and log in to a cluster, in one value that every Kafka
//! client kstate creates starts from.
//!
//! Why one type: security settings must reach every client or none works. A restore consumer
//! without `security.protocol` cannot read from a TLS listener even when the producer can write
//! to it, and the failure shows up only at the first restart. So the changelog producer, the
//! restore and metadata consumers, the admin client, the task runtime's input consumers and its
//! transactional producers, and the `kstate` command line all build their clients from one
//! `ClientProperties`, and add only their own settings on top.
//!
//! Why it redacts: these properties hold passwords and keys, and configs get printed (a `{:?}`
//! in a log line, an error that quotes a rejected value). `Debug` and `Display` show every value
//! librdkafka marks as sensitive as `[redacted]`, and client creation strips secret
//! values from the errors of client creation ([`ClientProperties::redact_error`]: rdkafka's
//! `ClientConfig` error quotes the value librdkafka rejected, and a Java-style `sasl.jaas.config`
//! holding a password is rejected with the password in the message).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;

use crate::error::ClientPropertiesError;

/// What a secret value is shown as.
pub const REDACTED: &str = "[redacted]";

/// The property that names the brokers.
const BOOTSTRAP_SERVERS: &str = "bootstrap.servers";

/// librdkafka's sensitive properties (`_RK_SENSITIVE` in `rdkafka_conf.c`, librdkafka 2.12),
/// and the Java clients' names for secrets, which users copy from a Java config and librdkafka
/// then refuses with the value in the message.
const SENSITIVE: &[&str] = &[
    "sasl.username",
    "sasl.password",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.assertion.private.key.file",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
    "ssl.ca.pem",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl.keystore.password",
    "ssl_key",
    // Java clients.
    "sasl.jaas.config",
    "ssl.truststore.password",
    "ssl.keystore.key",
    "ssl.truststore.certificates",
    "ssl.keystore.certificate.chain",
];

/// Whether `key` names a secret: one of librdkafka's sensitive properties, or any property
/// whose name says password, secret, credential, token, jaas or private key (a newer librdkafka
/// or a plugin may add some; a false positive only hides a value from a printout).
pub fn is_sensitive(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SENSITIVE.contains(&key.as_str())
        || [
            "password",
            "passphrase",
            "secret",
            "credential",
            "token",
            "jaas",
            "private",
        ]
        .iter()
        .any(|word| key.contains(word))
}

/// The brokers and every librdkafka property (security settings above all) that all of an
/// application's Kafka clients share.
///
/// Made from a bootstrap address (`From<&str>` and `From<String>`, so an address works wherever
/// `impl Into<ClientProperties>` is taken), then [`set`](Self::set) or a properties file
/// ([`from_file`](Self::from_file)):
///
/// ```
/// use kstate_kafka::ClientProperties;
///
/// let client = ClientProperties::new("broker-1:9093,broker-2:9093")
///     .set("security.protocol", "SASL_SSL")
///     .set("sasl.mechanisms", "SCRAM-SHA-512")
///     .set("sasl.username", "counter")
///     .set("sasl.password", "hunter2");
/// assert!(!format!("{client:?}").contains("hunter2"));
/// assert!(!client.to_string().contains("hunter2"));
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClientProperties {
    /// Every property, `bootstrap.servers` included, in name order.
    properties: BTreeMap<String, String>,
}

impl ClientProperties {
    /// Properties for the brokers at `bootstrap_servers` (`host:port,...`).
    pub fn new(bootstrap_servers: impl Into<String>) -> Self {
        ClientProperties::default().set(BOOTSTRAP_SERVERS, bootstrap_servers)
    }

    /// Reads a properties file of `key=value` lines (librdkafka names), as managed Kafka
    /// services hand them out: blank lines and lines starting with `#` or `!` are skipped,
    /// spaces around the key and before the value are dropped. It may set `bootstrap.servers`.
    /// A line without `=` or ending in `\` (continuations are not supported) is an error that
    /// names the file and the line, never the line's text (it may be a secret).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ClientPropertiesError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ClientPropertiesError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut properties = ClientProperties::default();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim_start();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let syntax = |problem: &'static str| ClientPropertiesError::Syntax {
                path: path.to_path_buf(),
                line: index + 1,
                problem,
            };
            let Some((key, value)) = line.split_once('=') else {
                return Err(syntax("expected key=value"));
            };
            let key = key.trim();
            if key.is_empty() {
                return Err(syntax("the key is empty"));
            }
            if line.ends_with('\\') {
                return Err(syntax(
                    "line continuations (a trailing \\) are not supported",
                ));
            }
            properties.insert(key, value.trim_start());
        }
        Ok(properties)
    }

    /// The cluster a program's command line names; every kstate binary and example follows this
    /// one rule. Start from the properties file `file` when given
    /// ([`from_file`](Self::from_file)). `bootstrap_servers` (a `--bootstrap-servers` flag)
    /// replaces its `bootstrap.servers` when given. `fallback_servers` (the programs pass
    /// `$KAFKA_BOOTSTRAP_SERVERS`) is used only when neither names the brokers: an explicit file
    /// wins over an ambient variable, so a shell's local broker address never receives a secured
    /// cluster's credentials. When none of the three names the brokers the result has no
    /// `bootstrap.servers` (see [`bootstrap_servers`](Self::bootstrap_servers)), for the
    /// program to refuse or to run without a cluster.
    pub fn from_sources(
        file: Option<&Path>,
        bootstrap_servers: Option<&str>,
        fallback_servers: Option<&str>,
    ) -> Result<Self, ClientPropertiesError> {
        let mut properties = match file {
            Some(path) => ClientProperties::from_file(path)?,
            None => ClientProperties::default(),
        };
        if let Some(servers) = bootstrap_servers {
            properties.insert(BOOTSTRAP_SERVERS, servers);
        } else if properties.bootstrap_servers().is_empty()
            && let Some(servers) = fallback_servers
        {
            properties.insert(BOOTSTRAP_SERVERS, servers);
        }
        Ok(properties)
    }

    /// Sets a librdkafka property (see librdkafka's CONFIGURATION.md); the last value set wins.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.insert(key, value);
        self
    }

    /// Sets a property in place.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.properties.insert(key.into(), value.into());
        self
    }

    /// `bootstrap.servers` (empty when not set).
    pub fn bootstrap_servers(&self) -> &str {
        self.get(BOOTSTRAP_SERVERS).unwrap_or_default()
    }

    /// A property's value.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.properties.get(key).map(String::as_str)
    }

    /// A client configuration with these properties, for the caller to add its own settings to.
    /// Pass a failure to create the client through [`redact_error`](Self::redact_error).
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (key, value) in &self.properties {
            config.set(key, value);
        }
        config
    }

    /// `error` without the secret values of these properties.
    pub fn redact_error(&self, error: KafkaError) -> KafkaError {
        match error {
            KafkaError::ClientConfig(result, description, key, value) => {
                let value = if is_sensitive(&key) {
                    REDACTED.to_string()
                } else {
                    self.redact(&value)
                };
                KafkaError::ClientConfig(result, self.redact(&description), key, value)
            }
            KafkaError::ClientCreation(message) => {
                KafkaError::ClientCreation(self.redact(&message))
            }
            other => other,
        }
    }

    /// `text` with every secret value of these properties replaced by [`REDACTED`].
    pub fn redact(&self, text: &str) -> String {
        let mut text = text.to_string();
        for value in self.secrets() {
            text = text.replace(value, REDACTED);
        }
        text
    }

    /// The values to hide in text, longest first (so a secret containing another is hidden
    /// whole). Not the user name: librdkafka counts it sensitive, and `Debug` hides it, but
    /// replaced in free text it would blank out every topic or host name that contains it.
    fn secrets(&self) -> Vec<&str> {
        let mut secrets: Vec<&str> = self
            .properties
            .iter()
            .filter(|(key, value)| {
                is_sensitive(key) && key.as_str() != "sasl.username" && !value.is_empty()
            })
            .map(|(_, value)| value.as_str())
            .collect();
        secrets.sort_by_key(|value| std::cmp::Reverse(value.len()));
        secrets
    }

    /// The properties as they may be shown: secret values replaced by [`REDACTED`].
    fn shown(&self) -> impl Iterator<Item = (&str, &str)> {
        self.properties.iter().map(|(key, value)| {
            let value = if is_sensitive(key) { REDACTED } else { value };
            (key.as_str(), value)
        })
    }
}

impl From<&str> for ClientProperties {
    fn from(bootstrap_servers: &str) -> Self {
        ClientProperties::new(bootstrap_servers)
    }
}

impl From<String> for ClientProperties {
    fn from(bootstrap_servers: String) -> Self {
        ClientProperties::new(bootstrap_servers)
    }
}

impl From<&String> for ClientProperties {
    fn from(bootstrap_servers: &String) -> Self {
        ClientProperties::new(bootstrap_servers.as_str())
    }
}

impl fmt::Debug for ClientProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.shown()).finish()
    }
}

/// `key=value` pairs separated by `, `, secrets redacted.
impl fmt::Display for ClientProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, (key, value)) in self.shown().enumerate() {
            if index > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{key}={value}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "s3cr3t-Pa55";

    fn secured() -> ClientProperties {
        ClientProperties::new("b:9093")
            .set("security.protocol", "SASL_SSL")
            .set("sasl.username", "user-1")
            .set("sasl.password", SECRET)
            .set("ssl.key.password", "key-Pa55")
            .set("sasl.oauthbearer.client.secret", "oidc-Pa55")
            .set("ssl.keystore.password", "store-Pa55")
    }

    #[test]
    fn debug_and_display_redact_every_secret() {
        let client = secured();
        for shown in [
            format!("{client:?}"),
            format!("{client:#?}"),
            client.to_string(),
        ] {
            for secret in [SECRET, "key-Pa55", "oidc-Pa55", "store-Pa55", "user-1"] {
                assert!(!shown.contains(secret), "{secret} shown in {shown}");
            }
            assert!(shown.contains("SASL_SSL"), "{shown}");
            assert!(shown.contains("b:9093"), "{shown}");
            assert!(shown.contains(REDACTED), "{shown}");
        }
    }

    #[test]
    fn sensitive_names_include_librdkafkas_and_javas() {
        for key in [
            "sasl.password",
            "ssl.key.pem",
            "ssl.truststore.password",
            "sasl.jaas.config",
            "some.future.secret",
            "SASL.PASSWORD",
        ] {
            assert!(is_sensitive(key), "{key}");
        }
        for key in [
            "security.protocol",
            "bootstrap.servers",
            "ssl.ca.location",
            "sasl.mechanisms",
        ] {
            assert!(!is_sensitive(key), "{key}");
        }
    }

    #[test]
    fn a_refused_secret_is_not_quoted_by_the_error() {
        let jaas = format!("ScramLoginModule required username=\"u\" password=\"{SECRET}\";");
        let client = ClientProperties::new("b:9093").set("sasl.jaas.config", jaas);
        let error = match client
            .client_config()
            .create::<rdkafka::consumer::BaseConsumer>()
        {
            Ok(_) => panic!("librdkafka has no sasl.jaas.config"),
            Err(error) => client.redact_error(error),
        };
        for shown in [error.to_string(), format!("{error:?}")] {
            assert!(!shown.contains(SECRET), "{shown}");
            assert!(shown.contains("sasl.jaas.config"), "{shown}");
        }
        // What rdkafka alone would have printed.
        let raw = match client
            .client_config()
            .create::<rdkafka::consumer::BaseConsumer>()
        {
            Ok(_) => panic!("librdkafka has no sasl.jaas.config"),
            Err(error) => error.to_string(),
        };
        assert!(
            raw.contains(SECRET),
            "rdkafka redacts this itself now: {raw}"
        );
    }

    #[test]
    fn redact_hides_values_inside_text() {
        let client = secured();
        let text = format!("user-1 failed with password {SECRET} and key-Pa55");
        assert_eq!(
            client.redact(&text),
            format!("user-1 failed with password {REDACTED} and {REDACTED}")
        );
    }

    #[test]
    fn a_properties_file_is_read_and_bad_lines_are_named_not_quoted() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("client.properties");
        std::fs::write(
            &path,
            format!(
                "# Confluent-style\r\n\nbootstrap.servers=b:9093\r\n  security.protocol = SASL_SSL\n\
                 ! comment\nsasl.password={SECRET}\n"
            ),
        )
        .expect("write");
        let client = ClientProperties::from_file(&path).expect("read");
        assert_eq!(client.bootstrap_servers(), "b:9093");
        assert_eq!(client.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(client.get("sasl.password"), Some(SECRET));

        std::fs::write(&path, format!("bootstrap.servers=b:9093\n{SECRET}\n")).expect("write");
        let error = ClientProperties::from_file(&path).expect_err("no =");
        let shown = error.to_string();
        assert!(
            shown.contains(":2:") && shown.contains("client.properties"),
            "{shown}"
        );
        assert!(!shown.contains(SECRET), "{shown}");

        let missing = ClientProperties::from_file(dir.path().join("absent")).expect_err("absent");
        assert!(missing.to_string().contains("absent"), "{missing}");
    }

    #[test]
    fn a_flag_replaces_the_files_brokers_and_the_environment_only_fills_a_gap() {
        let dir = tempfile::tempdir().expect("temp dir");
        let named = dir.path().join("named.properties");
        std::fs::write(
            &named,
            "bootstrap.servers=cloud:9093\nsecurity.protocol=SASL_SSL\n",
        )
        .expect("write");
        let unnamed = dir.path().join("unnamed.properties");
        std::fs::write(&unnamed, "security.protocol=SASL_SSL\n").expect("write");
        let servers = |file: Option<&Path>, flag: Option<&str>, fallback: Option<&str>| {
            ClientProperties::from_sources(file, flag, fallback)
                .expect("sources")
                .bootstrap_servers()
                .to_string()
        };
        let local = Some("localhost:9092");
        // The file's brokers win over the environment's.
        assert_eq!(servers(Some(&named), None, local), "cloud:9093");
        // A flag wins over both.
        assert_eq!(servers(Some(&named), Some("flag:1"), local), "flag:1");
        // The environment fills a file without brokers, or no file.
        assert_eq!(servers(Some(&unnamed), None, local), "localhost:9092");
        assert_eq!(servers(None, None, local), "localhost:9092");
        // Nothing names them: no bootstrap.servers, for the program to decide.
        assert_eq!(servers(None, None, None), "");
        let client =
            ClientProperties::from_sources(Some(&named), Some("flag:1"), local).expect("sources");
        assert_eq!(client.get("security.protocol"), Some("SASL_SSL"));
    }
}
