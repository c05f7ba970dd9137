//! A unified line diff of two texts (what `diff -u` prints), for shadow renders.
//!
//! The lines both texts start and end with are set aside; the rest is matched by a longest
//! common subsequence of lines. Past [`MAX_CELLS`] (two changed middles of about 2,000 lines
//! each) the middle is shown removed and added whole instead: still a correct diff, only a
//! longer one, at a bounded cost.

/// Lines of context around each change, as `diff -u`.
const CONTEXT: usize = 3;

/// The largest LCS table built (4 bytes a cell: 16 MiB).
const MAX_CELLS: usize = 4_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Line `a` of the old text is line `b` of the new one.
    Same(usize, usize),
    Delete(usize),
    Insert(usize),
}

/// The diff of `new` against `old` in unified format with `old_name` and `new_name` in its
/// header; empty when the texts are equal.
pub(crate) fn unified(old: &str, new: &str, old_name: &str, new_name: &str) -> String {
    if old == new {
        return String::new();
    }
    let a: Vec<&str> = old.split_inclusive('\n').collect();
    let b: Vec<&str> = new.split_inclusive('\n').collect();
    let ops = ops(&a, &b);
    let mut out = format!("--- {old_name}\n+++ {new_name}\n");
    for (start, end) in hunks(&ops) {
        let hunk = &ops[start..end];
        let (a_start, b_start) = first_lines(&ops, start);
        let a_len = hunk.iter().filter(|o| !matches!(o, Op::Insert(_))).count();
        let b_len = hunk.iter().filter(|o| !matches!(o, Op::Delete(_))).count();
        out.push_str(&format!(
            "@@ -{} +{} @@\n",
            range(a_start, a_len),
            range(b_start, b_len)
        ));
        for op in hunk {
            let (mark, line) = match *op {
                Op::Same(i, _) => (' ', a[i]),
                Op::Delete(i) => ('-', a[i]),
                Op::Insert(j) => ('+', b[j]),
            };
            out.push(mark);
            out.push_str(line);
            if !line.ends_with('\n') {
                out.push_str("\n\\ No newline at end of file\n");
            }
        }
    }
    out
}

/// `start,len` as a hunk header writes it: 1-based, the line before an empty range.
fn range(start: usize, len: usize) -> String {
    match len {
        0 => format!("{start},0"),
        1 => format!("{}", start + 1),
        _ => format!("{},{len}", start + 1),
    }
}

/// The (0-based) old and new line numbers where `ops[at]` stands.
fn first_lines(ops: &[Op], at: usize) -> (usize, usize) {
    ops[..at].iter().fold((0, 0), |(a, b), op| match op {
        Op::Same(..) => (a + 1, b + 1),
        Op::Delete(_) => (a + 1, b),
        Op::Insert(_) => (a, b + 1),
    })
}

/// The ranges of `ops` each hunk shows: every change with up to [`CONTEXT`] equal lines
/// around it, changes closer than twice that in one hunk.
fn hunks(ops: &[Op]) -> Vec<(usize, usize)> {
    let mut hunks: Vec<(usize, usize)> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        if matches!(op, Op::Same(..)) {
            continue;
        }
        let start = i.saturating_sub(CONTEXT);
        let end = (i + 1 + CONTEXT).min(ops.len());
        match hunks.last_mut() {
            Some(last) if start <= last.1 => last.1 = end,
            _ => hunks.push((start, end)),
        }
    }
    hunks
}

fn ops(a: &[&str], b: &[&str]) -> Vec<Op> {
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (a_mid, b_mid) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
    let mut ops: Vec<Op> = (0..prefix).map(|i| Op::Same(i, i)).collect();
    middle(a_mid, b_mid, prefix, &mut ops);
    let (a_end, b_end) = (a.len() - suffix, b.len() - suffix);
    ops.extend((0..suffix).map(|k| Op::Same(a_end + k, b_end + k)));
    ops
}

/// The ops of the middles (line `offset` of both texts onwards): an LCS table filled from the
/// end, walked from the start, deletions before insertions.
fn middle(a: &[&str], b: &[&str], offset: usize, ops: &mut Vec<Op>) {
    let (n, m) = (a.len(), b.len());
    if (n + 1).saturating_mul(m + 1) > MAX_CELLS {
        ops.extend((0..n).map(|i| Op::Delete(offset + i)));
        ops.extend((0..m).map(|j| Op::Insert(offset + j)));
        return;
    }
    let width = m + 1;
    let mut lcs = vec![0u32; (n + 1) * width];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i * width + j] = if a[i] == b[j] {
                lcs[(i + 1) * width + j + 1] + 1
            } else {
                lcs[(i + 1) * width + j].max(lcs[i * width + j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push(Op::Same(offset + i, offset + j));
            (i, j) = (i + 1, j + 1);
        } else if i < n && (j == m || lcs[(i + 1) * width + j] >= lcs[i * width + j + 1]) {
            ops.push(Op::Delete(offset + i));
            i += 1;
        } else {
            ops.push(Op::Insert(offset + j));
            j += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_texts_give_nothing() {
        assert_eq!(unified("a\nb\n", "a\nb\n", "x", "y"), "");
    }

    #[test]
    fn a_changed_line_shows_with_three_lines_of_context() {
        let old = "1\n2\n3\n4\n5\n6\n7\n8\n9\n";
        let new = "1\n2\n3\n4\nFIVE\n6\n7\n8\n9\n";
        assert_eq!(
            unified(old, new, "real/f", "shadow/f"),
            "--- real/f\n+++ shadow/f\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+FIVE\n 6\n 7\n 8\n"
        );
    }

    #[test]
    fn distant_changes_make_two_hunks_and_close_ones_one() {
        let lines = |names: &[(usize, &str)]| -> String {
            (1..=20)
                .map(|i| match names.iter().find(|(n, _)| *n == i) {
                    Some((_, name)) => format!("{name}\n"),
                    None => format!("{i}\n"),
                })
                .collect()
        };
        let old = lines(&[]);
        let new = lines(&[(2, "two"), (19, "nineteen")]);
        let text = unified(&old, &new, "a", "b");
        assert_eq!(text.matches("@@ -").count(), 2, "{text}");
        assert!(
            text.contains("@@ -1,5 +1,5 @@\n 1\n-2\n+two\n 3\n 4\n 5\n"),
            "{text}"
        );
        assert!(text.contains("@@ -16,5 +16,5 @@\n 16\n 17\n 18\n-19\n+nineteen\n 20\n"));
        let new = lines(&[(5, "five"), (10, "ten")]);
        assert_eq!(unified(&old, &new, "a", "b").matches("@@ -").count(), 1);
    }

    #[test]
    fn added_and_removed_lines_and_empty_sides() {
        assert_eq!(
            unified("", "x\ny\n", "a", "b"),
            "--- a\n+++ b\n@@ -0,0 +1,2 @@\n+x\n+y\n"
        );
        assert_eq!(
            unified("x\n", "", "a", "b"),
            "--- a\n+++ b\n@@ -1 +0,0 @@\n-x\n"
        );
        assert_eq!(
            unified("a\nc\n", "a\nb\nc\n", "a", "b"),
            "--- a\n+++ b\n@@ -1,2 +1,3 @@\n a\n+b\n c\n"
        );
    }

    #[test]
    fn a_missing_final_newline_is_marked() {
        assert_eq!(
            unified("a\n", "a", "x", "y"),
            "--- x\n+++ y\n@@ -1 +1 @@\n-a\n+a\n\\ No newline at end of file\n"
        );
    }

    #[test]
    fn the_lcs_keeps_lines_that_moved_around_a_change() {
        let text = unified("a\nb\nc\nd\n", "a\nc\nb\nd\n", "x", "y");
        // One of b or c stays; the other is removed and added.
        let kept = text.lines().filter(|l| l.starts_with(' ')).count();
        assert_eq!(kept, 3, "{text}");
    }

    #[test]
    fn a_huge_middle_is_removed_and_added_whole() {
        let old: String = (0..3000).map(|i| format!("{i}\n")).collect();
        let new: String = (0..3000).map(|i| format!("{}\n", i * 7)).collect();
        let text = unified(&old, &new, "a", "b");
        // The first line is the same; the other 2,999 go and come (plus the `---`/`+++` line).
        assert_eq!(text.lines().filter(|l| l.starts_with('-')).count(), 3000);
        assert_eq!(text.lines().filter(|l| l.starts_with('+')).count(), 3000);
        assert!(text.starts_with("--- a\n+++ b\n@@ -1,3000 +1,3000 @@\n 0\n-1\n"));
    }
}
