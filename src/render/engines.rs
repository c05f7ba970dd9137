//! Template engines behind one trait, chosen by file extension.
//!
//! - Handlebars (`.hbs`, `.handlebars`): non-strict (a missing variable renders empty) and without
//!   HTML escaping, as verwalter used it.
//! - Tera (`.tera`): autoescaping off. Built without Tera's optional "builtins" (date, slugify,
//!   filesizeformat, urlencode filters; now/get_random functions).

use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value};

/// The variables of one role's render, shared by all its templates. They are kept as
/// Handlebars' context, which owns them: made from the variables without a copy, and
/// [`Vars::shared`] lets the applier keep them after the render (the role log compares the next
/// attempt's with them). Tera's context is made from them on its first use.
pub struct Vars {
    handlebars: Arc<handlebars::Context>,
    tera: OnceLock<Result<tera::Context, String>>,
}

impl Vars {
    pub fn new(value: Map<String, Value>) -> Vars {
        Vars {
            handlebars: Arc::new(handlebars::Context::from(Value::Object(value))),
            tera: OnceLock::new(),
        }
    }

    /// The variables.
    pub(crate) fn map(&self) -> &Map<String, Value> {
        vars_of(&self.handlebars)
    }

    /// The variables, shared (no copy).
    pub(crate) fn shared(&self) -> Arc<handlebars::Context> {
        self.handlebars.clone()
    }
}

/// The variables a [`Vars`] holds as a Handlebars context (always an object).
pub(crate) fn vars_of(context: &handlebars::Context) -> &Map<String, Value> {
    static EMPTY: std::sync::LazyLock<Map<String, Value>> = std::sync::LazyLock::new(Map::new);
    context.data().as_object().unwrap_or(&EMPTY)
}

/// A set of templates of one engine, registered by their path relative to the template dir.
pub trait Engine: Send + Sync {
    /// Parses and registers a template. Err names the line where the engine knows it.
    fn add(&mut self, name: &str, source: &str) -> Result<(), String>;
    /// Renders a registered template.
    fn render(&self, name: &str, vars: &Vars) -> Result<String, String>;
}

/// The engine for a file name, if it is a template.
pub(crate) fn kind_of(name: &str) -> Option<EngineKind> {
    if name.ends_with(".hbs") || name.ends_with(".handlebars") {
        Some(EngineKind::Handlebars)
    } else if name.ends_with(".tera") {
        Some(EngineKind::Tera)
    } else {
        None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EngineKind {
    Handlebars,
    Tera,
}

pub struct HandlebarsEngine(handlebars::Handlebars<'static>);

impl Default for HandlebarsEngine {
    fn default() -> Self {
        let mut hb = handlebars::Handlebars::new();
        hb.register_escape_fn(handlebars::no_escape);
        hb.set_strict_mode(false);
        HandlebarsEngine(hb)
    }
}

impl Engine for HandlebarsEngine {
    fn add(&mut self, name: &str, source: &str) -> Result<(), String> {
        self.0
            .register_template_string(name, source)
            .map_err(|e| match e.pos() {
                Some((line, col)) => format!("line {line}, column {col}: {}", e.reason()),
                None => e.reason().to_string(),
            })
    }

    fn render(&self, name: &str, vars: &Vars) -> Result<String, String> {
        self.0
            .render_with_context(name, &vars.handlebars)
            .map_err(|e| match e.line_no {
                Some(line) => format!("line {line}: {}", e.reason()),
                None => e.reason().to_string(),
            })
    }
}

pub struct TeraEngine(tera::Tera);

impl Default for TeraEngine {
    fn default() -> Self {
        let mut tera = tera::Tera::default();
        tera.autoescape_on(Vec::new());
        TeraEngine(tera)
    }
}

/// Tera's error with its causes (the line is in the parser's cause).
fn tera_message(e: &tera::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(cause.to_string().trim());
        source = cause.source();
    }
    message
}

impl Engine for TeraEngine {
    fn add(&mut self, name: &str, source: &str) -> Result<(), String> {
        self.0
            .add_raw_template(name, source)
            .map_err(|e| tera_message(&e))
    }

    fn render(&self, name: &str, vars: &Vars) -> Result<String, String> {
        let context = vars
            .tera
            .get_or_init(|| {
                tera::Context::from_value(Value::Object(vars.map().clone()))
                    .map_err(|e| tera_message(&e))
            })
            .as_ref()
            .map_err(Clone::clone)?;
        self.0.render(name, context).map_err(|e| tera_message(&e))
    }
}
