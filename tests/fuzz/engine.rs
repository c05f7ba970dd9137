//! The mutational fuzzer: corpus-driven, deterministic, on stable Rust.
//!
//! Each target is a function from bytes to an *outcome class* (a short text: `ok`, or the kind of
//! error it gave). The engine starts from the target's corpus (`tests/fuzz/corpus/<target>/`),
//! mutates entries (bit flips, random and interesting bytes, inserts and deletes, duplicated
//! ranges, the target's dictionary tokens, interesting numbers, splices between entries,
//! truncation), several mutations stacked per input, and runs every input on a worker thread:
//!
//! - a panic (caught with `catch_unwind`, its message and place recorded by a panic hook that
//!   is silent only on fuzz workers) is a crash;
//! - an input still running after the time cap is a hang (the worker is abandoned, a new one
//!   takes over);
//! - an input whose outcome class was never seen before joins the working corpus: without
//!   coverage instrumentation (nightly only), the parsers' distinct error kinds are the signal
//!   that an input reached somewhere new.
//!
//! Crashes are minimized (chunks cut while the same panic place repeats) and written under
//! `target/fuzz-out/crashes/<target>/`. The random generator is SplitMix64 with a fixed seed per
//! target, so a run with the same budget of executions repeats exactly.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use super::structured::{self, Shape};

/// One fuzz target.
pub struct Target {
    pub name: &'static str,
    /// Runs one input through the real parser; returns the outcome class, panics on a broken
    /// property.
    pub run: fn(&[u8]) -> String,
    /// Tokens of the input's language, inserted and overwritten by the mutator.
    pub dict: &'static [&'static str],
    /// Inputs are cut to this many bytes.
    pub max_len: usize,
    /// The language of the inputs, for structure-aware mutations (`structured.rs`).
    pub shape: Shape,
}

/// How long a run lasts.
#[derive(Debug, Clone, Copy)]
pub enum Budget {
    Runs(u64),
    Time(Duration),
}

/// A panic found, with the smallest input found to give it.
#[derive(Debug, Clone)]
pub struct Crash {
    pub signature: String,
    pub message: String,
    pub input: Vec<u8>,
}

#[derive(Debug, Default)]
pub struct Report {
    pub execs: u64,
    pub elapsed: Duration,
    pub crashes: Vec<Crash>,
    pub hangs: Vec<Vec<u8>>,
    pub seeds: usize,
    pub new_entries: usize,
    pub classes: usize,
    /// Executions and time until the first crash, if any.
    pub first_crash: Option<(u64, Duration)>,
}

impl Report {
    pub fn per_second(&self) -> f64 {
        self.execs as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

thread_local! {
    static ON_WORKER: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<Option<(String, String)>> = const { RefCell::new(None) };
}

/// A panic hook that records panics on fuzz workers quietly and leaves every other thread's
/// panics (the other tests') to the hook that was there.
fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if ON_WORKER.with(Cell::get) {
                let place = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                let message = payload_text(info.payload());
                LAST_PANIC.with(|p| *p.borrow_mut() = Some((place, message)));
            } else {
                previous(info);
            }
        }));
    });
}

fn payload_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-text panic)".into()
    }
}

/// What a worker answers for one input.
enum Ran {
    Class(String),
    Panic { place: String, message: String },
}

type Job = (Arc<Vec<u8>>, mpsc::Sender<Ran>);

/// A thread that runs inputs one after another; replaced when one hangs.
struct Worker {
    jobs: mpsc::Sender<Job>,
}

impl Worker {
    fn spawn(run: fn(&[u8]) -> String, name: &str) -> Worker {
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(format!("fuzz-{name}"))
            .stack_size(16 << 20)
            .spawn(move || {
                ON_WORKER.with(|w| w.set(true));
                for (input, reply) in rx {
                    let result = std::panic::catch_unwind(|| run(&input));
                    let ran = match result {
                        Ok(class) => Ran::Class(class),
                        Err(payload) => {
                            let (place, message) = LAST_PANIC
                                .with(|p| p.borrow_mut().take())
                                .unwrap_or_else(|| (String::new(), payload_text(&*payload)));
                            Ran::Panic { place, message }
                        }
                    };
                    if reply.send(ran).is_err() {
                        break;
                    }
                }
            })
            .expect("spawn a fuzz worker");
        Worker { jobs }
    }
}

/// Runs inputs with a time cap each.
struct Executor {
    run: fn(&[u8]) -> String,
    name: &'static str,
    worker: Worker,
    cap: Duration,
}

enum Outcome {
    Class(String),
    Panic { place: String, message: String },
    Hang,
}

impl Executor {
    fn new(target: &Target, cap: Duration) -> Executor {
        Executor {
            run: target.run,
            name: target.name,
            worker: Worker::spawn(target.run, target.name),
            cap,
        }
    }

    fn exec(&mut self, input: &[u8]) -> Outcome {
        let (tx, rx) = mpsc::channel();
        let sent = self.worker.jobs.send((Arc::new(input.to_vec()), tx));
        if sent.is_err() {
            self.worker = Worker::spawn(self.run, self.name);
            return self.exec(input);
        }
        match rx.recv_timeout(self.cap) {
            Ok(Ran::Class(class)) => Outcome::Class(class),
            Ok(Ran::Panic { place, message }) => Outcome::Panic { place, message },
            Err(_) => {
                // The stuck thread is left behind; a fresh one takes the next input.
                self.worker = Worker::spawn(self.run, self.name);
                Outcome::Hang
            }
        }
    }
}

/// SplitMix64: small, fast, and the same sequence for the same seed everywhere.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Bytes and numbers that often sit on a parser's edges.
const INTERESTING_BYTES: &[u8] = &[
    0, 1, 0x7f, 0x80, 0xff, 0xc3, 0xe2, 0xf0, b'\n', b'\r', b'\t', b' ', b'"', b'\'', b'\\', b'{',
    b'}', b'[', b']', b':', b',', b'-', b'!', b'&', b'*', b'#', b'$', b'(', b')', b'.', b'/', b'%',
    b'|', b'>', b'0', b'9', b'e',
];

pub const INTERESTING_NUMBERS: &[&str] = &[
    "0",
    "-0",
    "-1",
    "1",
    "255",
    "256",
    "65535",
    "65536",
    "4294967295",
    "4294967296",
    "2147483648",
    "-2147483649",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "1e309",
    "-1e309",
    "1.7976931348623157e308",
    "5e-324",
    "0.1",
    "1.5",
    "NaN",
    ".nan",
    ".inf",
    "-.inf",
    "99999999999999999999999999999999",
];

/// Changes `data` in place by one mutation.
fn mutate_once(data: &mut Vec<u8>, rng: &mut Rng, dict: &[&str], corpus: &[Vec<u8>]) {
    let len = data.len();
    match rng.below(14) {
        0 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            data[i] = rng.next_u64() as u8;
        }
        2 if len > 0 => {
            let i = rng.below(len);
            data[i] = INTERESTING_BYTES[rng.below(INTERESTING_BYTES.len())];
        }
        3 => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(8);
            let bytes: Vec<u8> = (0..n)
                .map(|_| {
                    if rng.chance(2) {
                        INTERESTING_BYTES[rng.below(INTERESTING_BYTES.len())]
                    } else {
                        rng.next_u64() as u8
                    }
                })
                .collect();
            data.splice(at..at, bytes);
        }
        4 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(32));
            data.drain(at..at + n);
        }
        5 if len > 0 => {
            // Duplicate a range (nesting, repeated keys, long lists).
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(64));
            let chunk = data[at..at + n].to_vec();
            let most = if rng.chance(8) { 64 } else { 3 };
            let times = 1 + rng.below(most);
            let to = rng.below(len + 1);
            for _ in 0..times {
                data.splice(to..to, chunk.iter().copied());
            }
        }
        6 | 7 if !dict.is_empty() => {
            let token = dict[rng.below(dict.len())].as_bytes();
            let at = rng.below(len + 1);
            if rng.chance(2) || at == len {
                data.splice(at..at, token.iter().copied());
            } else {
                let end = (at + token.len()).min(len);
                data.splice(at..end, token.iter().copied());
            }
        }
        8 => {
            // Replace a run of digits (or insert) with an interesting number.
            let number = INTERESTING_NUMBERS[rng.below(INTERESTING_NUMBERS.len())].as_bytes();
            let digits: Vec<usize> = (0..len).filter(|&i| data[i].is_ascii_digit()).collect();
            if digits.is_empty() {
                let at = rng.below(len + 1);
                data.splice(at..at, number.iter().copied());
            } else {
                let start = digits[rng.below(digits.len())];
                let mut end = start;
                while end < len && (data[end].is_ascii_digit() || data[end] == b'.') {
                    end += 1;
                }
                let mut begin = start;
                while begin > 0 && data[begin - 1].is_ascii_digit() {
                    begin -= 1;
                }
                if begin > 0 && data[begin - 1] == b'-' {
                    begin -= 1;
                }
                data.splice(begin..end, number.iter().copied());
            }
        }
        9 if corpus.len() > 1 => {
            // Splice: a head of this input with a tail of another entry.
            let other = &corpus[rng.below(corpus.len())];
            let cut = rng.below(len + 1);
            let from = rng.below(other.len() + 1);
            data.truncate(cut);
            data.extend_from_slice(&other[from..]);
        }
        10 if corpus.len() > 1 => {
            // Insert a piece of another entry.
            let other = &corpus[rng.below(corpus.len())];
            if !other.is_empty() {
                let at = rng.below(other.len());
                let n = 1 + rng.below((other.len() - at).min(128));
                let to = rng.below(len + 1);
                data.splice(to..to, other[at..at + n].iter().copied());
            }
        }
        11 if len > 0 => {
            data.truncate(rng.below(len));
        }
        12 if len > 1 => {
            // Swap two bytes.
            let (a, b) = (rng.below(len), rng.below(len));
            data.swap(a, b);
        }
        13 if len > 0 => {
            // Arithmetic on one byte (digits walk through their neighbours).
            let i = rng.below(len);
            let delta = 1 + rng.below(16) as u8;
            data[i] = if rng.chance(2) {
                data[i].wrapping_add(delta)
            } else {
                data[i].wrapping_sub(delta)
            };
        }
        _ => {
            let at = rng.below(len + 1);
            data.insert(at, INTERESTING_BYTES[rng.below(INTERESTING_BYTES.len())]);
        }
    }
}

/// A new input from an entry of the corpus: 1 to 8 stacked mutations.
pub fn mutate(
    base: &[u8],
    rng: &mut Rng,
    dict: &[&str],
    corpus: &[Vec<u8>],
    max: usize,
) -> Vec<u8> {
    let mut data = base.to_vec();
    // Mostly one or two changes (a valid input stays near valid), sometimes many.
    let rounds = match rng.below(4) {
        0 | 1 => 1,
        2 => 2,
        _ => 1 + rng.below(12),
    };
    for _ in 0..rounds {
        mutate_once(&mut data, rng, dict, corpus);
    }
    data.truncate(max);
    data
}

/// An outcome class with numbers, quoted text and positions left out, so that `line 3` and
/// `line 4` of the same error are one class.
fn normalize(class: &str) -> String {
    let mut out = String::new();
    let mut quoted = false;
    for c in class.chars() {
        if c == '`' || c == '"' {
            quoted = !quoted;
            out.push(c);
        } else if quoted {
            continue;
        } else if c.is_ascii_digit() {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push(c);
        }
        if out.len() >= 72 {
            break;
        }
    }
    out
}

/// The corpus of a target: every file under `tests/fuzz/corpus/<target>/`, sorted by name.
pub fn load_corpus(name: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(name);
    let mut entries: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    entries.sort();
    entries
}

pub fn corpus_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/corpus")
        .join(name)
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Options of one run.
pub struct Options {
    pub budget: Budget,
    pub seed: u64,
    /// Time cap per input.
    pub cap: Duration,
    /// Where crashing inputs and (when set) new corpus entries are written.
    pub out_dir: Option<PathBuf>,
    pub save_new: bool,
}

/// Fuzzes one target: the corpus first (each entry must run clean), then mutations.
pub fn fuzz(target: &Target, options: &Options) -> Report {
    install_hook();
    let seeds = load_corpus(target.name);
    assert!(!seeds.is_empty(), "{}: empty corpus", target.name);
    let mut exec = Executor::new(target, options.cap);
    let mut rng = Rng::new(options.seed ^ fnv(target.name.as_bytes()));
    let mut report = Report {
        seeds: seeds.len(),
        ..Report::default()
    };
    // Every input run so far that was kept: the seeds first, then new outcome classes.
    let mut corpus: Vec<Vec<u8>> = Vec::new();
    let seed_count = seeds.len();
    // Recent inputs that parsed (class `ok...`): deep paths start from valid inputs.
    let mut oks: Vec<Vec<u8>> = Vec::new();
    let mut classes: HashSet<String> = HashSet::new();
    let mut crashes: BTreeMap<String, Crash> = BTreeMap::new();
    let start = Instant::now();
    let mut queue: Vec<Vec<u8>> = seeds.iter().map(|(_, b)| b.clone()).collect();
    queue.reverse();
    loop {
        let done = match options.budget {
            Budget::Runs(n) => report.execs >= n,
            Budget::Time(t) => report.execs.is_multiple_of(64) && start.elapsed() >= t,
        };
        if done && queue.is_empty() {
            break;
        }
        let from_seed = queue.pop();
        let input = match &from_seed {
            Some(seed) => seed.clone(),
            None => {
                // Half the time a seed (new classes must not bury them), a quarter a recent
                // input that parsed, else any entry.
                let base = match rng.below(4) {
                    0 | 1 => &corpus[rng.below(seed_count.min(corpus.len()))],
                    2 if !oks.is_empty() => &oks[rng.below(oks.len())],
                    _ => &corpus[rng.below(corpus.len())],
                };
                let structured = if target.shape != Shape::Bytes && rng.chance(2) {
                    structured::mutate(target.shape, base, &mut rng, target.dict)
                } else {
                    None
                };
                match structured {
                    Some(mut input) => {
                        input.truncate(target.max_len);
                        input
                    }
                    None => mutate(base, &mut rng, target.dict, &corpus, target.max_len),
                }
            }
        };
        report.execs += 1;
        match exec.exec(&input) {
            Outcome::Class(class) => {
                if class.starts_with("ok") && from_seed.is_none() {
                    if oks.len() < 1024 {
                        oks.push(input.clone());
                    } else {
                        let at = rng.below(oks.len());
                        oks[at] = input.clone();
                    }
                }
                let class = normalize(&class);
                if classes.insert(class) || from_seed.is_some() {
                    if from_seed.is_none() {
                        report.new_entries += 1;
                        if options.save_new
                            && let Some(dir) = &options.out_dir
                        {
                            let dir = dir.join("new-corpus").join(target.name);
                            let _ = std::fs::create_dir_all(&dir);
                            let _ =
                                std::fs::write(dir.join(format!("{:016x}", fnv(&input))), &input);
                        }
                    }
                    corpus.push(input);
                }
            }
            Outcome::Panic { place, message } => {
                let signature = format!("{place}: {}", normalize(&message));
                report
                    .first_crash
                    .get_or_insert((report.execs, start.elapsed()));
                if !crashes.contains_key(&signature) {
                    let input = minimize(&mut exec, &input, &place);
                    crashes.insert(
                        signature.clone(),
                        Crash {
                            signature,
                            message,
                            input,
                        },
                    );
                }
                if corpus.is_empty() {
                    corpus.push(input);
                }
            }
            Outcome::Hang => {
                report.hangs.push(input.clone());
                if report.hangs.len() >= 3 {
                    break;
                }
            }
        }
        if corpus.is_empty() && queue.is_empty() {
            corpus.push(Vec::new());
        }
    }
    report.elapsed = start.elapsed();
    report.classes = classes.len();
    report.crashes = crashes.into_values().collect();
    if let Some(dir) = &options.out_dir {
        let dir = dir.join("crashes").join(target.name);
        for crash in &report.crashes {
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::write(
                dir.join(format!("{:016x}", fnv(&crash.input))),
                &crash.input,
            );
        }
        for hang in &report.hangs {
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::write(dir.join(format!("hang-{:016x}", fnv(hang))), hang);
        }
    }
    report
}

/// Cuts chunks out of a crashing input while it still panics at the same place (at most a few
/// hundred tries).
fn minimize(exec: &mut Executor, input: &[u8], place: &str) -> Vec<u8> {
    let mut best = input.to_vec();
    let mut chunk = best.len().div_ceil(2).max(1);
    let mut tries = 0;
    while chunk >= 1 && tries < 400 {
        let mut at = 0;
        let mut cut_any = false;
        while at < best.len() && tries < 400 {
            let mut candidate = best.clone();
            let end = (at + chunk).min(candidate.len());
            candidate.drain(at..end);
            tries += 1;
            match exec.exec(&candidate) {
                Outcome::Panic { place: p, .. } if p == place => {
                    best = candidate;
                    cut_any = true;
                }
                _ => at += chunk,
            }
        }
        if !cut_any {
            if chunk == 1 {
                break;
            }
            chunk /= 2;
        }
    }
    best
}

/// The input as printable text, for reports.
pub fn shown(input: &[u8]) -> String {
    let text: String = input.escape_ascii().to_string();
    if text.len() > 400 {
        format!("{}... ({} bytes)", &text[..400], input.len())
    } else {
        text
    }
}
