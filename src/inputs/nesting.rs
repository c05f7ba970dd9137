//! How deeply a YAML or JSON text nests, estimated in one pass over its bytes before a parser
//! sees it: the YAML loader takes time quadratic in the depth (100,000 levels took 38 s).

/// Nesting deeper than this is refused before parsing. Both parsers give up at 128 levels on
/// their own (serde_json while parsing, serde_norway only after loading the whole document), so
/// refusing at that depth up front only makes the refusal cheap.
pub const MAX_NESTING: usize = 128;

/// The first line (1-based) at which YAML `text` nests deeper than `max`, if any.
///
/// Counts block levels by indentation (a stack of indents, one more per `- ` or `? ` that opens
/// a node on the same line) plus open flow collections (`[`, `{`) outside quotes, comments and
/// block scalars. A block sequence written at its key's indent counts one level for two, so the
/// estimate is at least half the real depth: enough to stop the costly cases.
pub fn yaml_too_deep(text: &str, max: usize) -> Option<u64> {
    let mut indents: Vec<usize> = Vec::new();
    let mut open = Open::default();
    // Lines indented more than this belong to a block scalar (`|`, `>`).
    let mut block_scalar: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let line_no = n as u64 + 1;
        let bytes = line.as_bytes();
        let indent = bytes.iter().take_while(|&&b| b == b' ').count();
        let blank = bytes[indent..].iter().all(|b| b.is_ascii_whitespace());
        if let Some(limit) = block_scalar {
            if blank || indent > limit {
                continue;
            }
            block_scalar = None;
        }
        let mut at = indent;
        // Columns of the last `-`/`?` opening a node on this line, and where its content starts.
        let mut dash: Option<usize> = None;
        if open.quote.is_none() && open.flow == 0 {
            let rest = &bytes[indent..];
            if blank || rest[0] == b'#' {
                continue;
            }
            if indent == 0 && (rest.starts_with(b"---") || rest.starts_with(b"...")) {
                indents.clear();
                continue;
            }
            (at, dash) = open_block_nodes(bytes, indent, &mut indents);
            if indents.len() > max {
                return Some(line_no);
            }
        }
        let content_start = at;
        let Ok(end) = scan_line(&mut open, bytes, at, indents.len(), max) else {
            return Some(line_no);
        };
        if open.quote.is_none() && open.flow == 0 {
            block_scalar = block_scalar_parent(&bytes[content_start..end], content_start, dash);
        }
    }
    None
}

/// What a YAML line leaves open for the next: a quoted scalar or flow collections.
#[derive(Default)]
struct Open {
    /// Flow collections (`[`, `{`) open.
    flow: usize,
    /// The quote (`"`, `'`) of the scalar open.
    quote: Option<u8>,
}

/// The nesting went past the limit.
struct TooDeep;

/// In block context, at the start of a line indented `indent`: pops the block levels it closes
/// and pushes its own, one more per `- ` or `? ` opening a node on it. Returns where its content
/// starts and the column of the last such `-`/`?`.
fn open_block_nodes(
    bytes: &[u8],
    indent: usize,
    indents: &mut Vec<usize>,
) -> (usize, Option<usize>) {
    while indents.last().is_some_and(|&i| i >= indent) {
        indents.pop();
    }
    indents.push(indent);
    let mut at = indent;
    let mut dash = None;
    while at < bytes.len()
        && matches!(bytes[at], b'-' | b'?')
        && bytes.get(at + 1).is_none_or(|&b| b == b' ')
    {
        dash = Some(at);
        at += 1;
        while bytes.get(at) == Some(&b' ') {
            at += 1;
        }
        if at < bytes.len() {
            indents.push(at);
        }
    }
    (at, dash)
}

/// Scans a line's bytes from its content (`at`) for flow collections and quotes, `depth` block
/// levels in. Returns where the content ends (a comment cut off).
fn scan_line(
    open: &mut Open,
    bytes: &[u8],
    at: usize,
    depth: usize,
    max: usize,
) -> Result<usize, TooDeep> {
    // In block context a collection or quoted scalar can only open where a node starts (at the
    // content or after `key: `); elsewhere `[`, `{` and quotes are part of plain text.
    let mut node_start = Some(at);
    let mut i = at;
    while i < bytes.len() {
        let b = bytes[i];
        let after_space = i == 0 || matches!(bytes[i - 1], b' ' | b'\t');
        match open.quote {
            Some(b'"') => match b {
                b'\\' => i += 1,
                b'"' => open.quote = None,
                _ => {}
            },
            Some(_) => {
                if b == b'\'' {
                    if bytes.get(i + 1) == Some(&b'\'') {
                        i += 1;
                    } else {
                        open.quote = None;
                    }
                }
            }
            None if b == b'#' && after_space => {
                return Ok(i);
            }
            None if open.flow > 0 => match b {
                b'[' | b'{' => {
                    open.flow += 1;
                    if depth + open.flow > max {
                        return Err(TooDeep);
                    }
                }
                b']' | b'}' => {
                    open.flow -= 1;
                    node_start = None;
                }
                b'"' | b'\''
                    if after_space
                        || i == at
                        || matches!(bytes[i - 1], b'[' | b'{' | b',' | b':') =>
                {
                    open.quote = Some(b)
                }
                _ => {}
            },
            None => {
                let at_node = node_start == Some(i);
                match b {
                    b'[' | b'{' if at_node => {
                        open.flow += 1;
                        if depth + open.flow > max {
                            return Err(TooDeep);
                        }
                    }
                    b'"' | b'\'' if at_node => open.quote = Some(b),
                    // A tag or anchor comes before the node it belongs to.
                    b'!' | b'&' if at_node => {
                        while i < bytes.len() && bytes[i] != b' ' {
                            i += 1;
                        }
                        while bytes.get(i) == Some(&b' ') {
                            i += 1;
                        }
                        node_start = Some(i);
                        continue;
                    }
                    b':' if bytes.get(i + 1).is_none_or(|&b| b == b' ') => {
                        let mut next = i + 1;
                        while bytes.get(next) == Some(&b' ') {
                            next += 1;
                        }
                        node_start = Some(next);
                    }
                    _ => {}
                }
            }
        }
        i += 1;
    }
    Ok(bytes.len())
}

/// When a line's content (from column `start`, comment cut off) ends in a block scalar header
/// (`key: |`, `- >-`), the column its text must be indented past.
fn block_scalar_parent(content: &[u8], start: usize, dash: Option<usize>) -> Option<usize> {
    let text = std::str::from_utf8(content).ok()?.trim_end();
    let (before, token) = match text.rsplit_once(' ') {
        Some((before, token)) => (before.trim_end(), token),
        None => ("", text),
    };
    let mut chars = token.chars();
    if !matches!(chars.next(), Some('|' | '>'))
        || !chars.all(|c| matches!(c, '+' | '-' | '1'..='9'))
        || token.len() > 3
    {
        return None;
    }
    // What may stand before the header: nothing (a sequence entry), a key, or a tag or anchor.
    let (rest, last) = before.rsplit_once(' ').unwrap_or(("", before));
    let before = if last.starts_with('!') || last.starts_with('&') {
        rest.trim_end()
    } else {
        before
    };
    if before.is_empty() {
        dash
    } else if before.ends_with(':') {
        Some(start)
    } else {
        None
    }
}

/// The first line (1-based) at which JSON `text` nests deeper than `max`, if any.
pub(crate) fn json_too_deep(text: &str, max: usize) -> Option<u64> {
    let mut depth = 0usize;
    let mut line = 1u64;
    let mut in_string = false;
    let mut escaped = false;
    for &b in text.as_bytes() {
        if b == b'\n' {
            line += 1;
        }
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return Some(line);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested_block(levels: usize) -> String {
        (0..levels)
            .map(|i| format!("{}k{i}:\n", "  ".repeat(i)))
            .collect::<String>()
            + &"  ".repeat(levels)
            + "leaf: 1\n"
    }

    #[test]
    fn deep_yaml_is_found_at_its_line_in_every_form() {
        let max = 128;
        // Block mappings: the level that passes the limit is on line max + 1.
        assert_eq!(yaml_too_deep(&nested_block(200), max), Some(129));
        // Flow collections, on one line and spread over lines.
        assert_eq!(
            yaml_too_deep(&format!("a: {}1{}", "[".repeat(200), "]".repeat(200)), max),
            Some(1)
        );
        // Two block levels (`a:` and the indented line) and one flow level per line.
        let spread = format!("a:\n{}", "  {x:\n".repeat(200));
        assert_eq!(yaml_too_deep(&spread, max), Some(128));
        // Compact sequences: every `- ` opens a level.
        assert_eq!(
            yaml_too_deep(&format!("{}x\n", "- ".repeat(200)), max),
            Some(1)
        );
        // The case from the issue: 100,000 levels, found without parsing them.
        let issue = format!("{}x\n", "- ".repeat(100_000));
        assert_eq!(yaml_too_deep(&issue, max), Some(1));
    }

    #[test]
    fn real_yaml_is_not_refused() {
        let max = 128;
        // As deep as the parser allows (it counts the leaf's mapping too).
        let deep = nested_block(120);
        assert_eq!(yaml_too_deep(&deep, max), None);
        assert!(serde_norway::from_str::<serde_norway::Value>(&deep).is_ok());
        // Brackets in quotes, comments, plain words and block scalars are text, not nesting.
        let many = "[{".repeat(150);
        let text = format!(
            "quoted: \"{many}\"\nsingle: '{many} it''s'\nplain: it's {many}\n\
             # {many}\nscript: |\n  {many}\n  more {many}\n\
             list:\n  - >-\n    {many}\n  - !tag |\n    {many}\nafter: [1, 2]\n"
        );
        assert_eq!(yaml_too_deep(&text, max), None, "{text}");
        // A block scalar ends where the indentation falls back.
        let text = format!("a: |\n  text\nb:\n{}", nested_block(200));
        assert!(yaml_too_deep(&text, max).is_some());
    }

    #[test]
    fn json_depth_counts_brackets_outside_strings() {
        let deep = format!("{}1{}", "[".repeat(129), "]".repeat(129));
        assert_eq!(json_too_deep(&deep, 128), Some(1));
        let fine = format!(
            "{{\"a\": \"{}\",\n \"b\": {}1{}}}",
            "[\\\"".repeat(300),
            "[".repeat(100),
            "]".repeat(100)
        );
        assert_eq!(json_too_deep(&fine, 128), None);
        assert!(serde_json::from_str::<serde_json::Value>(&fine).is_ok());
    }
}
