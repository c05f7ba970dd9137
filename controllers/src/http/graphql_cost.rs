//! What a GraphQL document costs before anything runs it: the number of selections it stands
//! for once every fragment spread is replaced by the fragment (docs/http-api.md, "Limits").
//!
//! A fragment may spread another twice, which spreads the next twice, and so on: 23 such
//! fragments in about a kilobyte stand for 2²³ selections, and every pass that expands spreads
//! (async-graphql's depth check, its complexity and depth validators, execution) pays for each
//! of them. Counted here instead, each fragment's size is computed once from the sizes of the
//! fragments it spreads (memoised, bottom-up, iteratively so that a long chain cannot overflow
//! the stack), with saturating sums, so the count costs time linear in the document, and a
//! document past the cap is refused before any of those passes.
//!
//! The caller flattens the parsed document into [`Unit`]s: for each operation and fragment,
//! how many fields and inline fragments it holds at any depth of its own text, and the
//! fragments it spreads, once per spread (each spread counts 1 and what it stands for).

use std::collections::HashMap;

/// One operation or fragment of a document, flattened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unit<'a> {
    /// Fields and inline fragments written in its own text, at any depth (its spreads count
    /// 1 each, from [`Unit::spreads`]).
    pub selections: u64,
    /// The fragments it spreads, by name, once per spread (a name spread twice is listed
    /// twice).
    pub spreads: Vec<&'a str>,
}

/// A document flattened: its operations and its fragments by name.
#[derive(Debug, Clone, Default)]
pub struct Document<'a> {
    pub operations: Vec<Unit<'a>>,
    pub fragments: HashMap<&'a str, Unit<'a>>,
}

/// Why a document is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TooCostly {
    /// Its operations stand for more than `cap` selections once fragments are expanded.
    OverCap { cap: u64 },
    /// Fragment `name` spreads itself, directly or through others (GraphQL forbids it).
    Cycle { name: String },
}

impl std::fmt::Display for TooCostly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TooCostly::OverCap { cap } => write!(
                f,
                "the query selects more than {cap} fields once its fragments are expanded \
                 (fragment spreads and inline fragments count too); this node answers at most \
                 {cap}"
            ),
            TooCostly::Cycle { name } => {
                write!(f, "fragment {name} spreads itself (through its spreads)")
            }
        }
    }
}

/// How many selections `doc` stands for with every spread expanded: its operations and its
/// fragment definitions, each expanded (validation visits every operation, and every
/// definition, used or not, with the spreads inside it), or why it is refused: more than
/// `cap`, or a fragment cycle. A spread of an unknown fragment counts 1 (the spread;
/// validation refuses it). Time and memory are linear in the size of `doc`, whatever the count.
pub fn expanded_selections(doc: &Document<'_>, cap: u64) -> Result<u64, TooCostly> {
    let sizes = fragment_sizes(doc, cap)?;
    let mut total: u64 = 0;
    for operation in &doc.operations {
        total = add(total, size_of(operation, &sizes, cap), cap);
    }
    for size in sizes.values() {
        total = add(total, *size, cap);
    }
    if total > cap {
        return Err(TooCostly::OverCap { cap });
    }
    Ok(total)
}

/// At most `cap + 1`: every count past the cap is the same refusal.
fn add(a: u64, b: u64, cap: u64) -> u64 {
    a.saturating_add(b).min(cap.saturating_add(1))
}

/// The size of `unit` given the sizes of the fragments it spreads.
fn size_of(unit: &Unit<'_>, sizes: &HashMap<&str, u64>, cap: u64) -> u64 {
    let mut size = unit.selections.min(cap.saturating_add(1));
    for spread in &unit.spreads {
        // The spread itself, and what it stands for.
        size = add(size, 1, cap);
        size = add(size, sizes.get(spread).copied().unwrap_or(0), cap);
    }
    size
}

/// The expanded size of every fragment (capped at `cap + 1`), each computed once after the
/// fragments it spreads: a depth-first walk with an explicit stack.
fn fragment_sizes<'a>(doc: &Document<'a>, cap: u64) -> Result<HashMap<&'a str, u64>, TooCostly> {
    let mut sizes: HashMap<&'a str, u64> = HashMap::with_capacity(doc.fragments.len());
    let mut open: std::collections::HashSet<&'a str> = std::collections::HashSet::new();
    for &root in doc.fragments.keys() {
        if sizes.contains_key(root) {
            continue;
        }
        // (fragment, index of its next spread to look at)
        let mut stack: Vec<(&'a str, usize)> = vec![(root, 0)];
        open.insert(root);
        while let Some(top) = stack.last_mut() {
            let name = top.0;
            let unit = &doc.fragments[name];
            if let Some(&spread) = unit.spreads.get(top.1) {
                top.1 += 1;
                if sizes.contains_key(spread) || !doc.fragments.contains_key(spread) {
                    continue;
                }
                if !open.insert(spread) {
                    return Err(TooCostly::Cycle {
                        name: spread.to_string(),
                    });
                }
                stack.push((spread, 0));
                continue;
            }
            sizes.insert(name, size_of(unit, &sizes, cap));
            open.remove(name);
            stack.pop();
        }
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(selections: u64, spreads: &[&'static str]) -> Unit<'static> {
        Unit {
            selections,
            spreads: spreads.to_vec(),
        }
    }

    /// `fragment F0 { ...F1 ...F1 __typename }` ... `fragment F<n> { __typename }`, spread once
    /// by `{ status { ...F0 } }`.
    fn doubling(levels: usize) -> (Vec<String>, Vec<(usize, usize)>) {
        let names: Vec<String> = (0..=levels).map(|i| format!("F{i}")).collect();
        let edges = (0..levels).map(|i| (i, i + 1)).collect();
        (names, edges)
    }

    fn doubling_doc<'a>(names: &'a [String], edges: &[(usize, usize)]) -> Document<'a> {
        let mut doc = Document {
            operations: vec![Unit {
                selections: 1,
                spreads: vec![names[0].as_str()],
            }],
            fragments: HashMap::new(),
        };
        for name in names {
            doc.fragments.insert(name.as_str(), unit(1, &[]));
        }
        for &(from, to) in edges {
            let spreads = &mut doc.fragments.get_mut(names[from].as_str()).unwrap().spreads;
            spreads.push(names[to].as_str());
            spreads.push(names[to].as_str());
        }
        doc
    }

    #[test]
    fn a_document_without_fragments_costs_its_selections() {
        let doc = Document {
            operations: vec![unit(7, &[])],
            fragments: HashMap::new(),
        };
        assert_eq!(expanded_selections(&doc, 100), Ok(7));
        assert_eq!(
            expanded_selections(&doc, 6),
            Err(TooCostly::OverCap { cap: 6 })
        );
        // Every operation counts: validation visits them all.
        let two = Document {
            operations: vec![unit(7, &[]), unit(5, &[])],
            fragments: HashMap::new(),
        };
        assert_eq!(expanded_selections(&two, 100), Ok(12));
    }

    #[test]
    fn spreads_count_what_their_fragment_stands_for_each_time() {
        // { status { ...A ...A ...B } }, A = { x y ...B }, B = { z }.
        let mut fragments = HashMap::new();
        fragments.insert("A", unit(2, &["B"]));
        fragments.insert("B", unit(1, &[]));
        let doc = Document {
            operations: vec![unit(1, &["A", "A", "B"])],
            fragments,
        };
        // B = 1; A = 2 + (1 + 1) = 4; the operation = 1 + 2 × (1 + 4) + (1 + 1) = 13; and the
        // definitions themselves, 4 + 1.
        assert_eq!(expanded_selections(&doc, 1000), Ok(18));
        // Unknown fragments cost their spread only; an unused fragment costs its definition
        // (validation visits it too).
        let mut fragments = HashMap::new();
        fragments.insert("Unused", unit(400, &[]));
        let doc = Document {
            operations: vec![unit(1, &["Nowhere", "Nowhere"])],
            fragments,
        };
        assert_eq!(expanded_selections(&doc, 1000), Ok(403));
        // Unused fragments that double are refused as used ones are.
        let (names, edges) = doubling(30);
        let mut doc = doubling_doc(&names, &edges);
        doc.operations = vec![unit(1, &[])];
        assert_eq!(
            expanded_selections(&doc, 10_000),
            Err(TooCostly::OverCap { cap: 10_000 })
        );
    }

    #[test]
    fn doubling_fragments_are_counted_without_expanding_them() {
        // F<n> = 1, F<i> = 1 + 2 × (1 + F<i+1>): F<i> = 2^(n-i+2) - 3. The operation is
        // 1 + 1 + F0; the definitions add up to (2^(n+3) - 4) - 3(n + 1).
        let (names, edges) = doubling(10);
        let doc = doubling_doc(&names, &edges);
        assert_eq!(
            expanded_selections(&doc, u64::MAX - 1),
            Ok((1 + 1 + (1 << 12) - 3) + ((1 << 13) - 4 - 3 * 11))
        );
        // 23, 30 and 5,000 levels (far past u64) are refused at once, with the cap named.
        for levels in [23, 30, 5_000] {
            let (names, edges) = doubling(levels);
            let doc = doubling_doc(&names, &edges);
            assert_eq!(
                expanded_selections(&doc, 10_000),
                Err(TooCostly::OverCap { cap: 10_000 }),
                "{levels}"
            );
        }
        // Without a cap the count saturates at u64::MAX instead of overflowing.
        let (names, edges) = doubling(200);
        let doc = doubling_doc(&names, &edges);
        assert_eq!(expanded_selections(&doc, u64::MAX), Ok(u64::MAX));
    }

    #[test]
    fn a_long_chain_needs_no_deep_stack() {
        // F0 -> F1 -> ... -> F200000, each spread once: F<i> = 1 + 2 × (200,000 - i), the
        // operation 1 + F0 = 400,002, the definitions 200,001².
        let names: Vec<String> = (0..=200_000).map(|i| format!("F{i}")).collect();
        let mut fragments = HashMap::new();
        for (i, name) in names.iter().enumerate() {
            let spreads = names
                .get(i + 1)
                .map(|n| vec![n.as_str()])
                .unwrap_or_default();
            fragments.insert(
                name.as_str(),
                Unit {
                    selections: 1,
                    spreads,
                },
            );
        }
        let doc = Document {
            operations: vec![Unit {
                selections: 0,
                spreads: vec![names[0].as_str()],
            }],
            fragments,
        };
        assert_eq!(
            expanded_selections(&doc, u64::MAX - 1),
            Ok(400_002 + 200_001 * 200_001)
        );
    }

    #[test]
    fn a_fragment_cycle_is_refused_by_name() {
        let mut fragments = HashMap::new();
        fragments.insert("A", unit(1, &["B"]));
        fragments.insert("B", unit(1, &["C"]));
        fragments.insert("C", unit(1, &["A"]));
        let doc = Document {
            operations: vec![unit(1, &["A"])],
            fragments,
        };
        let Err(TooCostly::Cycle { name }) = expanded_selections(&doc, 1000) else {
            panic!("a cycle was counted");
        };
        assert!(["A", "B", "C"].contains(&name.as_str()), "{name}");
        let mut fragments = HashMap::new();
        fragments.insert("Self", unit(1, &["Self"]));
        let doc = Document {
            operations: vec![],
            fragments,
        };
        assert_eq!(
            expanded_selections(&doc, 1000),
            Err(TooCostly::Cycle {
                name: "Self".into()
            })
        );
    }

    #[test]
    fn the_refusal_names_the_cap() {
        let message = TooCostly::OverCap { cap: 10_000 }.to_string();
        assert!(message.contains("10000"), "{message}");
    }
}
