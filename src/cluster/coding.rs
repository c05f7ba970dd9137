//! How a schedule travels between nodes: its `Content-Encoding`.
//!
//! A node asks for `Accept-Encoding: x-verwalter-lz4, gzip`. Nodes of this version answer with
//! [`LZ4`], an LZ4 block after its inflated size (4 bytes, little-endian): a schedule of
//! service definitions shrinks about as much as with gzip's fast level but inflates three
//! times faster, and every node inflates every schedule. A server that knows only gzip (this
//! version's earlier releases, any HTTP tool) answers gzip; verwalter 0.13 ignores the header
//! and answers plain JSON. Whatever comes is checked against the schedule's hash after it is
//! inflated, and inflating stops at the size limit, whatever the body claims.

use std::io::Read;

use axum::http::{HeaderMap, HeaderValue, header};

/// The content-coding token of an LZ4 block after its inflated size, between verwalter nodes.
pub(crate) const LZ4: &str = "x-verwalter-lz4";

/// What a node sends in `Accept-Encoding` when it fetches a schedule.
pub(crate) const ACCEPTED: &str = "x-verwalter-lz4, gzip";

/// A schedule body's content-coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Gzip,
    Lz4,
}

impl Coding {
    /// The `Content-Encoding` token (`identity` for none).
    pub(crate) fn token(self) -> &'static str {
        match self {
            Coding::Identity => "identity",
            Coding::Gzip => "gzip",
            Coding::Lz4 => LZ4,
        }
    }

    /// The coding of a response from its `Content-Encoding` (none: identity); `None` for a
    /// coding this node cannot read.
    pub(crate) fn of_response(headers: &HeaderMap) -> Option<Coding> {
        let Some(value) = headers.get(header::CONTENT_ENCODING) else {
            return Some(Coding::Identity);
        };
        let value = value.to_str().ok()?.trim();
        [Coding::Identity, Coding::Gzip, Coding::Lz4]
            .into_iter()
            .find(|c| value.eq_ignore_ascii_case(c.token()))
    }

    /// The coding to answer a request with: LZ4 for a client that names it, gzip for one that
    /// takes gzip (or `*`), identity otherwise. A coding given `q=0` is refused.
    pub(crate) fn for_request(headers: &HeaderMap) -> Coding {
        let mut gzip = false;
        for item in headers
            .get_all(header::ACCEPT_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
        {
            let mut parts = item.split(';').map(str::trim);
            let coding = parts.next().unwrap_or("");
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            if refused {
                continue;
            }
            if coding.eq_ignore_ascii_case(LZ4) {
                return Coding::Lz4;
            }
            gzip |= coding.eq_ignore_ascii_case("gzip") || coding == "*";
        }
        if gzip { Coding::Gzip } else { Coding::Identity }
    }

    /// Whether a client that asked with `headers` reads this coding.
    pub(crate) fn taken_by(self, headers: &HeaderMap) -> bool {
        match (self, Coding::for_request(headers)) {
            (Coding::Identity, _) | (Coding::Lz4, Coding::Lz4) => true,
            // A client that names LZ4 names gzip too; this version's do.
            (Coding::Gzip, asked) => asked != Coding::Identity,
            (Coding::Lz4, _) => false,
        }
    }

    /// The `Content-Encoding` header value, `None` for identity.
    pub(crate) fn header(self) -> Option<HeaderValue> {
        (self != Coding::Identity).then(|| HeaderValue::from_static(self.token()))
    }

    /// `bytes` in this coding (gzip at its fast level: a schedule is compressed once per
    /// change, on the node that serves it first).
    pub fn encode(self, bytes: &[u8]) -> Vec<u8> {
        match self {
            Coding::Identity => bytes.to_vec(),
            Coding::Gzip => {
                use std::io::Write;
                let mut encoder = flate2::write::GzEncoder::new(
                    Vec::with_capacity(bytes.len() / 4),
                    flate2::Compression::fast(),
                );
                encoder
                    .write_all(bytes)
                    .and_then(|()| encoder.finish())
                    .expect("compressing into memory cannot fail")
            }
            Coding::Lz4 => lz4_flex::block::compress_prepend_size(bytes),
        }
    }

    /// `body` decoded, refused past `limit` bytes (a small body may inflate a lot). It is
    /// inflated into a schedule's spare buffer when one is big enough for the size the body
    /// gives (see `schedule_data::text_buffer`): a megabyte's worth of fresh pages costs more
    /// than inflating into them.
    pub fn decode(self, body: hyper::body::Bytes, limit: usize) -> Result<Vec<u8>, String> {
        match self {
            Coding::Identity => Ok(Vec::from(body)),
            Coding::Gzip => gunzip(&body, limit),
            Coding::Lz4 => unlz4(&body, limit),
        }
    }
}

fn gunzip(body: &[u8], limit: usize) -> Result<Vec<u8>, String> {
    // ISIZE, the size of the input mod 2^32: a hint only, the limit still holds.
    let size = match body.len().checked_sub(4) {
        Some(at) => u32::from_le_bytes(body[at..].try_into().expect("4 bytes")) as usize,
        None => 0,
    };
    let mut out = verwalter_controllers::schedule::data::text_buffer(size.min(limit));
    let read = flate2::read::GzDecoder::new(body)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("cannot decompress the gzip body: {e}"))?;
    if read > limit {
        return Err(format!(
            "the gzip body inflates past {limit} bytes, the limit"
        ));
    }
    Ok(out)
}

fn unlz4(body: &[u8], limit: usize) -> Result<Vec<u8>, String> {
    let Some((size, block)) = body.split_first_chunk::<4>() else {
        return Err(format!("the {LZ4} body is shorter than its size"));
    };
    let size = u32::from_le_bytes(*size) as usize;
    if size > limit {
        return Err(format!(
            "the {LZ4} body inflates to {size} bytes, past {limit}, the limit"
        ));
    }
    let mut out = verwalter_controllers::schedule::data::text_buffer(size);
    out.resize(size, 0);
    match lz4_flex::block::decompress_into(block, &mut out) {
        Ok(n) if n == size => Ok(out),
        Ok(n) => Err(format!(
            "the {LZ4} body inflates to {n} bytes, not the {size} it gives"
        )),
        Err(e) => Err(format!("cannot decompress the {LZ4} body: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asking(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_str(value).unwrap(),
        );
        headers
    }

    #[test]
    fn the_coding_answered_is_the_best_the_client_names() {
        assert_eq!(Coding::for_request(&asking(ACCEPTED)), Coding::Lz4);
        assert_eq!(Coding::for_request(&asking("gzip, deflate")), Coding::Gzip);
        assert_eq!(Coding::for_request(&asking("*")), Coding::Gzip);
        assert_eq!(Coding::for_request(&asking("br")), Coding::Identity);
        assert_eq!(Coding::for_request(&HeaderMap::new()), Coding::Identity);
        let refused = asking("x-verwalter-lz4;q=0, gzip;q=0.5");
        assert_eq!(Coding::for_request(&refused), Coding::Gzip);
        assert!(Coding::Gzip.taken_by(&asking(ACCEPTED)));
        assert!(!Coding::Lz4.taken_by(&asking("gzip")));
        assert!(!Coding::Gzip.taken_by(&asking("gzip;q=0")));
    }

    /// A small body can inflate a thousandfold: the schedule limit holds for what it inflates
    /// to, not for what came over the wire, nor for the size it claims.
    #[test]
    fn a_body_is_limited_by_what_it_inflates_to() {
        let zeros = vec![b'0'; 1 << 20];
        for coding in [Coding::Gzip, Coding::Lz4] {
            let bomb = hyper::body::Bytes::from(coding.encode(&zeros));
            assert!(bomb.len() * 64 < zeros.len(), "{coding:?}: {}", bomb.len());
            assert_eq!(coding.decode(bomb.clone(), 1 << 20).unwrap(), zeros);
            let refused = coding.decode(bomb.clone(), (1 << 20) - 1).unwrap_err();
            assert!(refused.contains("1048575"), "{refused}");
            let torn = bomb.slice(..bomb.len() / 2);
            let refused = coding.decode(torn, 1 << 20).unwrap_err();
            assert!(refused.contains("decompress"), "{coding:?}: {refused}");
        }
        // An LZ4 body that claims another size than it inflates to, or none.
        let mut lying = Coding::Lz4.encode(b"{\"a\":1}");
        lying[0] += 1;
        let refused = Coding::Lz4.decode(lying.into(), 100).unwrap_err();
        assert!(
            refused.contains("decompress") || refused.contains("gives"),
            "{refused}"
        );
        let refused = Coding::Lz4.decode(vec![1, 0].into(), 100).unwrap_err();
        assert!(refused.contains("shorter"), "{refused}");
    }
}
