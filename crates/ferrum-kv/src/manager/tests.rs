use proptest::prelude::*;

use super::*;

/// Every block is in exactly one state, and reference counts equal the
/// number of tables that hold the block.
fn check_invariants(m: &BlockManager) {
    let mut refs = vec![0u32; m.meta.len()];
    for s in m.seqs.values() {
        for &b in &s.blocks {
            refs[b as usize] += 1;
        }
        assert!(s.tokens.len() <= s.blocks.len() * m.block_size);
        assert_eq!(s.hashes.len(), s.tokens.len() / m.block_size);
    }
    for (b, meta) in m.meta.iter().enumerate() {
        assert_eq!(meta.refs, refs[b], "block {b} reference count");
        let free = m.free.contains(&(b as u32));
        let evictable = m.evictable.values().any(|&e| e == b as u32);
        match meta.refs {
            0 => assert!(free ^ evictable, "unused block {b} must be free xor cached"),
            _ => assert!(!free && !evictable, "used block {b} is also listed as free"),
        }
        if evictable {
            assert!(meta.key.is_some(), "evictable block {b} names no prefix");
        }
        if let Some(h) = meta.key {
            assert_eq!(m.by_hash.get(&h).map(|c| c.block), Some(b as u32));
        }
    }
    assert_eq!(
        m.by_hash.len(),
        m.meta.iter().filter(|x| x.key.is_some()).count()
    );
}

fn write(m: &mut BlockManager, seq: &str, tokens: &[u32]) -> Result<Vec<BlockCopy>> {
    let len = m.len(seq);
    let copies = m.reserve(seq, len + tokens.len())?;
    m.commit(seq, tokens);
    Ok(copies)
}

#[test]
fn allocates_blocks_as_a_sequence_grows() {
    let mut m = BlockManager::new(8, 4, true);
    assert_eq!(m.blocks_needed("a", 9), 3);
    write(&mut m, "a", &[1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
    assert_eq!(m.table("a").len(), 3);
    assert_eq!(m.len("a"), 9);
    assert_eq!(m.usage().used_blocks, 3);
    write(&mut m, "a", &[10, 11, 12]).unwrap();
    assert_eq!(m.table("a").len(), 3);
    write(&mut m, "a", &[13]).unwrap();
    assert_eq!(m.table("a").len(), 4);
    check_invariants(&m);
    m.release("a");
    assert_eq!(m.usage().used_blocks, 0);
    // Three full blocks stay cached; the partial one is free.
    assert_eq!(m.usage().cached_blocks, 3);
    check_invariants(&m);
}

#[test]
fn exhaustion_fails_without_side_effects() {
    let mut m = BlockManager::new(2, 4, true);
    write(&mut m, "a", &[1, 2, 3, 4, 5]).unwrap();
    let before = m.usage();
    let err = m.reserve_many([("a", 8), ("b", 2)]).unwrap_err();
    assert!(
        matches!(err, FerrumError::KvExhausted { needed: 1, free: 0 }),
        "{err}"
    );
    assert_eq!(m.usage(), before);
    assert!(!m.contains("b"));
    check_invariants(&m);
}

#[test]
fn prefix_blocks_are_shared_and_leave_one_token_to_compute() {
    let mut m = BlockManager::new(16, 4, true);
    let prompt: Vec<u32> = (0..12).collect();
    assert_eq!(m.match_prefix("a", &prompt), 0);
    write(&mut m, "a", &prompt).unwrap();
    // Same 12 tokens: only 2 of 3 full blocks may be reused (the last
    // token must be computed for its logits).
    assert_eq!(m.match_prefix("b", &prompt), 8);
    assert_eq!(m.table("b"), &m.table("a")[..2]);
    // A longer prompt with the same start reuses all three.
    let mut longer = prompt.clone();
    longer.extend([50, 51]);
    assert_eq!(m.match_prefix("c", &longer), 12);
    // A different second block stops the match at the first.
    let mut other = prompt.clone();
    other[5] = 99;
    assert_eq!(m.match_prefix("d", &other), 4);
    let u = m.usage();
    assert_eq!(u.prefix_query_tokens, 12 + 12 + 14 + 12);
    assert_eq!(u.prefix_hit_tokens, 8 + 12 + 4);
    check_invariants(&m);
}

#[test]
fn released_prefix_survives_until_evicted_lru() {
    let mut m = BlockManager::new(4, 2, true);
    write(&mut m, "a", &[1, 2, 3, 4]).unwrap();
    m.release("a");
    write(&mut m, "b", &[5, 6, 7, 8]).unwrap();
    m.release("b");
    assert_eq!(m.usage().cached_blocks, 4);
    // Touch "a"'s prefix so "b"'s blocks are the oldest.
    assert_eq!(m.match_prefix("a2", &[1, 2, 3, 4, 9]), 4);
    m.release("a2");
    // Needs two blocks: both come from "b"'s (least recently used).
    write(&mut m, "c", &[20, 21, 22]).unwrap();
    assert_eq!(m.match_prefix("a3", &[1, 2, 3, 4, 9]), 4);
    assert_eq!(m.match_prefix("b2", &[5, 6, 7, 8, 9]), 0);
    check_invariants(&m);
}

#[test]
fn writing_into_a_shared_block_copies_it() {
    let mut m = BlockManager::new(8, 4, true);
    write(&mut m, "a", &[1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
    assert_eq!(m.match_prefix("b", &[1, 2, 3, 4, 5, 6, 7, 8, 9]), 8);
    // Roll "b" back into its shared second block and write there.
    m.truncate("b", 6);
    let shared = m.table("b")[1];
    let copies = write(&mut m, "b", &[60]).unwrap();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].src, shared);
    assert_ne!(m.table("b")[1], shared);
    assert_eq!(
        m.table("a")[1],
        shared,
        "the other sequence keeps its block"
    );
    check_invariants(&m);
}

#[test]
fn rewriting_an_own_cached_block_unregisters_it() {
    let mut m = BlockManager::new(8, 4, true);
    write(&mut m, "a", &[1, 2, 3, 4, 5]).unwrap();
    m.truncate("a", 2);
    write(&mut m, "a", &[30, 40]).unwrap();
    // The old prefix [1, 2, 3, 4] is gone: the block now holds [1, 2, 30, 40].
    assert_eq!(m.match_prefix("b", &[1, 2, 3, 4, 5]), 0);
    write(&mut m, "a", &[50]).unwrap();
    assert_eq!(m.match_prefix("c", &[1, 2, 30, 40, 7]), 4);
    check_invariants(&m);
}

#[test]
fn prefix_caching_can_be_turned_off() {
    let mut m = BlockManager::new(8, 4, false);
    write(&mut m, "a", &[1, 2, 3, 4, 5]).unwrap();
    assert_eq!(m.match_prefix("b", &[1, 2, 3, 4, 5]), 0);
    m.release("a");
    assert_eq!(m.usage().cached_blocks, 0);
    check_invariants(&m);
}

#[derive(Clone, Debug)]
enum Op {
    Write(u8, Vec<u32>),
    Match(u8, Vec<u32>),
    Truncate(u8, usize),
    Release(u8),
}

fn op() -> impl Strategy<Value = Op> {
    // A tiny alphabet makes shared prefixes common.
    let toks = prop::collection::vec(0u32..3, 1..12);
    prop_oneof![
        (0u8..5, toks.clone()).prop_map(|(s, t)| Op::Write(s, t)),
        (0u8..5, toks).prop_map(|(s, t)| Op::Match(s, t)),
        (0u8..5, 0usize..20).prop_map(|(s, n)| Op::Truncate(s, n)),
        (0u8..5).prop_map(Op::Release),
    ]
}

proptest! {
    /// Random traffic keeps the pool consistent, never hands out more
    /// blocks than exist, and returns every block once all sequences end.
    #[test]
    fn random_traffic_keeps_invariants(ops in prop::collection::vec(op(), 1..80)) {
        let mut m = BlockManager::new(12, 3, true);
        m.record_events();
        // The cache as a router rebuilds it from the events alone.
        let mut mirror: HashMap<u64, Vec<u32>> = HashMap::new();
        // What each sequence should hold, to check matches are exact.
        let mut truth: HashMap<String, Vec<u32>> = HashMap::new();
        // What a model's K/V pool would hold: one token per position.
        let bs = m.block_size();
        let mut pool = vec![u32::MAX; 12 * bs];
        for op in ops {
            match op {
                Op::Write(s, t) => {
                    let id = format!("s{s}");
                    let len = m.len(&id);
                    if let Ok(copies) = m.reserve(&id, len + t.len()) {
                        for c in copies {
                            let (src, dst) = (c.src as usize * bs, c.dst as usize * bs);
                            pool.copy_within(src..src + bs, dst);
                        }
                        for (i, &tok) in t.iter().enumerate() {
                            let p = len + i;
                            pool[m.table(&id)[p / bs] as usize * bs + p % bs] = tok;
                        }
                        m.commit(&id, &t);
                        truth.entry(id).or_default().extend(t);
                    }
                }
                Op::Match(s, t) => {
                    let id = format!("s{s}");
                    let hit = m.match_prefix(&id, &t);
                    if hit > 0 {
                        truth.insert(id, t[..hit].to_vec());
                    }
                }
                Op::Truncate(s, n) => {
                    let id = format!("s{s}");
                    m.truncate(&id, n);
                    if let Some(t) = truth.get_mut(&id) {
                        t.truncate(n);
                    }
                }
                Op::Release(s) => {
                    let id = format!("s{s}");
                    m.release(&id);
                    truth.remove(&id);
                }
            }
            check_invariants(&m);
            for e in m.take_events() {
                match e {
                    KvEvent::Stored { hashes, tokens, .. } => {
                        prop_assert_eq!(tokens.len(), hashes.len() * bs);
                        for (h, t) in hashes.iter().zip(tokens.chunks(bs)) {
                            prop_assert!(mirror.insert(*h, t.to_vec()).is_none(), "stored twice");
                        }
                    }
                    KvEvent::Removed { hashes } => {
                        for h in hashes {
                            prop_assert!(mirror.remove(&h).is_some(), "removed but never stored");
                        }
                    }
                    KvEvent::AllCleared => mirror.clear(),
                }
            }
            prop_assert_eq!(mirror.len(), m.by_hash.len());
            for (h, c) in &m.by_hash {
                let held = &m.block_tokens[c.block as usize * bs..][..bs];
                prop_assert_eq!(mirror.get(h).map(Vec::as_slice), Some(held));
            }
            for (id, t) in &truth {
                prop_assert_eq!(&m.seqs[id].tokens, t);
                // Reading through the table gives back exactly the tokens:
                // sharing and copy-on-write never alias a written position.
                let seen: Vec<u32> = (0..t.len())
                    .map(|p| pool[m.table(id)[p / bs] as usize * bs + p % bs])
                    .collect();
                prop_assert_eq!(&seen, t);
            }
        }
        for id in truth.keys() {
            m.release(id);
        }
        for s in 0..5 {
            m.release(&format!("s{s}"));
        }
        prop_assert_eq!(m.usage().used_blocks, 0);
        check_invariants(&m);
    }
}

#[test]
fn events_name_stored_and_evicted_blocks() {
    let mut m = BlockManager::new(3, 4, true);
    write(&mut m, "a", &[1, 2, 3, 4, 5]).unwrap();
    assert!(
        m.take_events().is_empty(),
        "nothing is recorded until asked"
    );
    m.record_events();
    write(&mut m, "a", &[6, 7, 8, 9]).unwrap();
    // Only the block that became full: its parent is the first block.
    let h1 = chain(0, &[1, 2, 3, 4]);
    let h2 = chain(h1, &[5, 6, 7, 8]);
    assert_eq!(
        m.take_events(),
        vec![KvEvent::Stored {
            hashes: vec![h2],
            parent: Some(h1),
            tokens: vec![5, 6, 7, 8]
        }]
    );
    m.release("a");
    // Two blocks registered in one commit make one event.
    write(&mut m, "b", &[10, 11, 12, 13, 14, 15, 16, 17, 18]).unwrap();
    let g1 = chain(0, &[10, 11, 12, 13]);
    let g2 = chain(g1, &[14, 15, 16, 17]);
    // "b" took the free block and evicted the two oldest cached ones.
    assert_eq!(
        m.take_events(),
        vec![
            KvEvent::Removed { hashes: vec![h1] },
            KvEvent::Removed { hashes: vec![h2] },
            KvEvent::Stored {
                hashes: vec![g1, g2],
                parent: None,
                tokens: vec![10, 11, 12, 13, 14, 15, 16, 17]
            },
        ]
    );
    m.clear();
    assert_eq!(m.take_events(), vec![KvEvent::AllCleared]);
}
