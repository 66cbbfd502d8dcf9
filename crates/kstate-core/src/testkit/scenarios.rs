//! The conformance scenarios. Each takes a [`Harness`], runs once per [`WritePath`] on a fresh
//! store, and checks one guarantee of the [`KeyValueStore`] contract.

use std::collections::BTreeMap;
use std::ops::Bound::{self, Excluded, Included, Unbounded};

use super::{Harness, WritePath};
use crate::error::Error;
use crate::range::{KeyRange, Order};
use crate::store::{Entry, KeyValueStore, Mutation};

fn put(k: &[u8], v: &[u8]) -> Mutation {
    (k.to_vec(), Some(v.to_vec()))
}

fn del(k: &[u8]) -> Mutation {
    (k.to_vec(), None)
}

fn collect(iter: crate::store::EntryIter<'_>) -> Vec<Entry> {
    iter.collect::<Result<_, _>>().unwrap()
}

/// Runs `check` on a fresh store for each write path.
fn each_path<H: Harness>(harness: &mut H, mut check: impl FnMut(&H::Store, WritePath)) {
    for path in WritePath::ALL {
        let store = harness.open();
        check(&store, path);
        store.close().unwrap();
    }
}

/// The model's answer for a range, to compare engines against.
fn model_range(model: &BTreeMap<Vec<u8>, Vec<u8>>, range: &KeyRange, order: Order) -> Vec<Entry> {
    if range.is_empty() {
        return Vec::new();
    }
    let it = model
        .range::<[u8], _>(range.as_bounds())
        .map(|(k, v)| (k.clone(), v.clone()));
    match order {
        Order::Forward => it.collect(),
        Order::Reverse => it.rev().collect(),
    }
}

pub fn get_of_a_missing_key_is_none<H: Harness>(h: &mut H) {
    each_path(h, |s, path| {
        assert_eq!(s.get(b"absent").unwrap(), None);
        path.apply(s, &[put(b"a", b"1")]);
        assert_eq!(s.get(b"absent").unwrap(), None);
        assert_eq!(s.get(b"").unwrap(), None);
    });
}

pub fn put_then_get_returns_the_value<H: Harness>(h: &mut H) {
    each_path(h, |s, path| {
        path.apply(
            s,
            &[put(b"k1", b"v1"), put(b"k2", b"v2"), put(b"", b"empty key")],
        );
        assert_eq!(
            s.get(b"k1").unwrap().as_deref(),
            Some(&b"v1"[..]),
            "{path:?}"
        );
        assert_eq!(
            s.get(b"k2").unwrap().as_deref(),
            Some(&b"v2"[..]),
            "{path:?}"
        );
        assert_eq!(
            s.get(b"").unwrap().as_deref(),
            Some(&b"empty key"[..]),
            "{path:?}"
        );
    });
}

pub fn later_writes_win<H: Harness>(h: &mut H) {
    each_path(h, |s, path| {
        path.apply(
            s,
            &[put(b"k", b"1"), put(b"k", b"2"), del(b"j"), put(b"j", b"3")],
        );
        assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"2"[..]), "{path:?}");
        assert_eq!(s.get(b"j").unwrap().as_deref(), Some(&b"3"[..]), "{path:?}");
        path.apply(s, &[put(b"x", b"1"), del(b"x")]);
        assert_eq!(s.get(b"x").unwrap(), None, "{path:?}");
    });
}

pub fn delete_removes_and_deleting_a_missing_key_is_fine<H: Harness>(h: &mut H) {
    each_path(h, |s, path| {
        path.apply(s, &[put(b"a", b"1"), put(b"b", b"2")]);
        path.apply(s, &[del(b"a"), del(b"never-written")]);
        assert_eq!(s.get(b"a").unwrap(), None, "{path:?}");
        assert_eq!(s.get(b"b").unwrap().as_deref(), Some(&b"2"[..]), "{path:?}");
        assert_eq!(
            collect(s.all().unwrap()),
            vec![(b"b".to_vec(), b"2".to_vec())]
        );
    });
}

pub fn empty_values_are_not_absent_values<H: Harness>(h: &mut H) {
    each_path(h, |s, path| {
        path.apply(s, &[put(b"k", b"")]);
        assert_eq!(s.get(b"k").unwrap(), Some(Vec::new()), "{path:?}");
        assert_eq!(collect(s.all().unwrap()).len(), 1, "{path:?}");
    });
}

pub fn multi_get_answers_in_request_order<H: Harness>(h: &mut H) {
    each_path(h, |s, path| {
        path.apply(s, &[put(b"a", b"1"), put(b"c", b"3")]);
        let got = s.multi_get(&[b"c", b"b", b"a", b"c"]).unwrap();
        assert_eq!(
            got,
            vec![
                Some(b"3".to_vec()),
                None,
                Some(b"1".to_vec()),
                Some(b"3".to_vec())
            ],
            "{path:?}"
        );
        assert!(s.multi_get(&[]).unwrap().is_empty());
    });
}

pub fn keys_order_as_unsigned_bytes<H: Harness>(h: &mut H) {
    let keys: [&[u8]; 7] = [
        b"\xff",
        b"\x80",
        b"\x7f",
        b"\x01\x00",
        b"\x01",
        b"",
        b"\x00",
    ];
    each_path(h, |s, path| {
        let mutations: Vec<Mutation> = keys.iter().map(|k| put(k, b"v")).collect();
        path.apply(s, &mutations);
        let got: Vec<Vec<u8>> = collect(s.all().unwrap()).into_iter().map(|e| e.0).collect();
        let mut want: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
        want.sort();
        assert_eq!(got, want, "{path:?}");
        assert_eq!(got[0], b"", "the empty key sorts first");
        assert_eq!(got[6], b"\xff", "bytes compare unsigned");
    });
}

/// Keys 0..40 step 2 as two-byte big-endian, so bounds can fall on and between keys.
fn even_keys() -> (Vec<Mutation>, BTreeMap<Vec<u8>, Vec<u8>>) {
    let mut model = BTreeMap::new();
    let mut mutations = Vec::new();
    for i in (0u16..40).step_by(2) {
        let (k, v) = (i.to_be_bytes().to_vec(), format!("v{i}").into_bytes());
        mutations.push(put(&k, &v));
        model.insert(k, v);
    }
    (mutations, model)
}

fn bounds() -> Vec<Bound<Vec<u8>>> {
    let mut all = vec![Unbounded];
    for i in [0u16, 1, 10, 11, 38, 39, 40, 100] {
        all.push(Included(i.to_be_bytes().to_vec()));
        all.push(Excluded(i.to_be_bytes().to_vec()));
    }
    all.push(Included(vec![0x00])); // a prefix of key 0x0000: sorts before it
    all.push(Excluded(vec![0x00, 0x0a, 0x00])); // just after key 10
    all
}

fn check_ranges<S: KeyValueStore>(
    s: &S,
    model: &BTreeMap<Vec<u8>, Vec<u8>>,
    order: Order,
    path: WritePath,
) {
    for start in bounds() {
        for end in bounds() {
            let range = KeyRange::new(
                start.as_ref().map(Vec::as_slice),
                end.as_ref().map(Vec::as_slice),
            );
            let got = match order {
                Order::Forward => collect(
                    s.range(
                        start.as_ref().map(Vec::as_slice),
                        end.as_ref().map(Vec::as_slice),
                    )
                    .unwrap(),
                ),
                Order::Reverse => collect(
                    s.reverse_range(
                        start.as_ref().map(Vec::as_slice),
                        end.as_ref().map(Vec::as_slice),
                    )
                    .unwrap(),
                ),
            };
            assert_eq!(
                got,
                model_range(model, &range, order),
                "{path:?} {order:?} {start:?}..{end:?}"
            );
        }
    }
}

pub fn ranges_honour_every_kind_of_bound<H: Harness>(h: &mut H) {
    each_path(h, |s, path| {
        let (mutations, model) = even_keys();
        path.apply(s, &mutations);
        check_ranges(s, &model, Order::Forward, path);
    });
}

pub fn reverse_ranges_mirror_forward_ranges<H: Harness>(h: &mut H) {
    each_path(h, |s, path| {
        let (mutations, model) = even_keys();
        path.apply(s, &mutations);
        check_ranges(s, &model, Order::Reverse, path);
    });
}

pub fn prefix_scans_cover_exactly_the_prefix<H: Harness>(h: &mut H) {
    each_path(h, |s, path| {
        let keys: [&[u8]; 8] = [
            b"a",
            b"ab",
            b"ab\x00",
            b"ab\xff",
            b"ac",
            b"\xff",
            b"\xff\xff",
            b"\xff\xff\x01",
        ];
        let mutations: Vec<Mutation> = keys.iter().map(|k| put(k, b"v")).collect();
        path.apply(s, &mutations);
        let scan = |p: &[u8]| -> Vec<Vec<u8>> {
            collect(s.prefix_scan(p).unwrap())
                .into_iter()
                .map(|e| e.0)
                .collect()
        };
        assert_eq!(
            scan(b"ab"),
            vec![b"ab".to_vec(), b"ab\x00".to_vec(), b"ab\xff".to_vec()],
            "{path:?}"
        );
        assert_eq!(
            scan(b"\xff\xff"),
            vec![b"\xff\xff".to_vec(), b"\xff\xff\x01".to_vec()],
            "{path:?}"
        );
        assert_eq!(scan(b"").len(), keys.len(), "{path:?}");
        assert!(scan(b"zz").is_empty(), "{path:?}");
    });
}

pub fn inverted_ranges_are_empty<H: Harness>(h: &mut H) {
    each_path(h, |s, path| {
        path.apply(s, &[put(b"a", b"1"), put(b"b", b"2"), put(b"c", b"3")]);
        assert!(
            collect(s.range(Included(b"c"), Excluded(b"a")).unwrap()).is_empty(),
            "{path:?}"
        );
        assert!(
            collect(s.reverse_range(Included(b"c"), Excluded(b"a")).unwrap()).is_empty(),
            "{path:?}"
        );
        assert!(
            collect(s.range(Included(b"b"), Excluded(b"b")).unwrap()).is_empty(),
            "{path:?}"
        );
        assert_eq!(
            collect(s.range(Included(b"b"), Included(b"b")).unwrap()).len(),
            1,
            "{path:?}"
        );
    });
}

pub fn long_scans_see_every_key_once<H: Harness>(h: &mut H) {
    each_path(h, |s, path| {
        let n = 2_000u32;
        let mutations: Vec<Mutation> = (0..n)
            .map(|i| put(&(i * 7919 % n).to_be_bytes(), &i.to_le_bytes()))
            .collect();
        path.apply(s, &mutations);
        let forward = collect(s.all().unwrap());
        assert_eq!(forward.len(), n as usize, "{path:?}");
        assert!(forward.windows(2).all(|w| w[0].0 < w[1].0), "{path:?}");
        let mut reverse = collect(s.scan(&KeyRange::all(), Order::Reverse).unwrap());
        reverse.reverse();
        assert_eq!(reverse, forward, "{path:?}");
    });
}

pub fn large_values_round_trip<H: Harness>(h: &mut H) {
    each_path(h, |s, path| {
        let big: Vec<u8> = (0..(1usize << 20)).map(|i| (i % 251) as u8).collect();
        path.apply(s, &[put(b"big", &big)]);
        assert_eq!(
            s.get(b"big").unwrap().as_deref(),
            Some(big.as_slice()),
            "{path:?}"
        );
    });
}

pub fn approximate_len_tracks_the_entry_count<H: Harness>(h: &mut H) {
    each_path(h, |s, path| {
        assert_eq!(s.approximate_len().unwrap(), 0, "{path:?}: an empty store");
        let mutations: Vec<Mutation> = (0..1_000u32).map(|i| put(&i.to_be_bytes(), b"v")).collect();
        path.apply(s, &mutations);
        let len = s.approximate_len().unwrap();
        assert!(
            (500..=2_000).contains(&len),
            "{path:?}: approximate_len {len} for 1000 entries"
        );
    });
}

pub fn closed_stores_refuse_every_operation<H: Harness>(h: &mut H) {
    let s = h.open();
    s.put(b"k", b"v").unwrap();
    s.close().unwrap();
    s.close().unwrap(); // closing twice is fine
    let closed = |r: Result<(), Error>, op: &str| {
        assert!(
            matches!(r, Err(Error::Closed { .. })),
            "{op} on a closed store: {r:?}"
        );
    };
    closed(s.get(b"k").map(drop), "get");
    closed(s.put(b"k", b"v"), "put");
    closed(s.delete(b"k"), "delete");
    closed(s.all().map(drop), "all");
    closed(s.flush(), "flush");
    closed(s.approximate_len().map(drop), "approximate_len");
}

pub fn reopen_keeps_every_flushed_write<H: Harness>(h: &mut H) {
    for path in WritePath::ALL {
        let s = h.open();
        path.apply(
            &s,
            &[put(b"a", b"1"), put(b"b", b"2"), del(b"a"), put(b"c", b"3")],
        );
        s.flush().unwrap();
        let s = h.reopen(s);
        assert_eq!(
            collect(s.all().unwrap()),
            vec![
                (b"b".to_vec(), b"2".to_vec()),
                (b"c".to_vec(), b"3".to_vec())
            ],
            "{path:?}"
        );
        s.close().unwrap();
    }
}

pub fn drop_range_removes_exactly_the_range<H: Harness>(h: &mut H) {
    each_path(h, |s, path| {
        let keys: [&[u8]; 6] = [b"", b"a", b"b", b"b\x00", b"c", b"\xff\xff"];
        let writes: Vec<Mutation> = keys.iter().map(|k| put(k, b"v")).collect();
        path.apply(s, &writes);
        // Committed first: a changelog-backed store drops only what it committed.
        s.flush().unwrap();
        s.drop_range(&KeyRange::new(Included(b"b"), Included(b"c")))
            .unwrap();
        let left: Vec<Vec<u8>> = collect(s.all().unwrap())
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            left,
            [b"".to_vec(), b"a".to_vec(), b"\xff\xff".to_vec()],
            "{path:?}"
        );
        s.drop_range(&KeyRange::new(Excluded(b""), Unbounded))
            .unwrap();
        assert_eq!(
            collect(s.all().unwrap()),
            [(Vec::new(), b"v".to_vec())],
            "{path:?}"
        );
        s.drop_range(&KeyRange::all()).unwrap();
        assert_eq!(collect(s.all().unwrap()), [], "{path:?}");
        // The store goes on as before.
        path.apply(s, &[put(b"b", b"again")]);
        assert_eq!(s.get(b"b").unwrap(), Some(b"again".to_vec()));
    });
}
