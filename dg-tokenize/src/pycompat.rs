//! Python behaviour that chat templates rely on, for minijinja.
//!
//! transformers renders templates with Jinja2 on Python values, so what a template prints is
//! Python's `str()` of a value, its `tojson` is `json.dumps`, and `trim` strips Python whitespace.
//! Each function here reproduces one of those exactly (checked against Python in the goldens).

use std::fmt::Write as _;

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Error as JError, ErrorKind, State};

/// Python's `str.isspace()` set: Unicode White_Space plus the ASCII separators U+001C..U+001F.
pub(crate) fn is_py_whitespace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python `str.strip(chars)` / `lstrip` / `rstrip`.
pub(crate) fn py_strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let matches = |c: char| match chars {
        Some(set) => set.contains(c),
        None => is_py_whitespace(c),
    };
    let mut out = s;
    if left {
        out = out.trim_start_matches(matches);
    }
    if right {
        out = out.trim_end_matches(matches);
    }
    out
}

/// Python's `repr(float)` (also its `str()` and what `json.dumps` writes for finite floats).
pub(crate) fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits, as Python's repr does; only the layout
    // differs: Python writes fixed notation for decimal exponents -4..=15, else `d.ddde+XX`.
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp < 0 {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        } else if exp + 1 >= n {
            format!("{}{}.0", digits, "0".repeat((exp + 1 - n) as usize))
        } else {
            let (int, frac) = digits.split_at((exp + 1) as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let mant = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mant}e{esign}{:02}", exp.abs())
    }
}

fn number_str(v: &Value) -> String {
    if v.is_integer() {
        v.to_string()
    } else {
        match f64::try_from(v.clone()) {
            Ok(f) => py_float_repr(f),
            Err(_) => v.to_string(),
        }
    }
}

/// Python `repr()` of a string (single quotes unless the text has `'` and no `"`).
fn py_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            // Non-printable C0/C1 controls; Python also escapes a few other unprintable classes.
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

fn py_repr_into(v: &Value, out: &mut String) {
    match v.kind() {
        ValueKind::String => py_str_repr(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(iter) = v.try_iter() {
                for (i, item) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr_into(&item, out);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(iter) = v.try_iter() {
                for (i, key) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr_into(&key, out);
                    out.push_str(": ");
                    py_repr_into(&v.get_item(&key).unwrap_or(Value::UNDEFINED), out);
                }
            }
            out.push('}');
        }
        _ => out.push_str(&py_str(v)),
    }
}

/// Python's `str()` of a template value: what `{{ value }}` prints under Jinja2.
pub(crate) fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => if v.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number => number_str(v),
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        ValueKind::Seq | ValueKind::Map => {
            let mut s = String::new();
            py_repr_into(v, &mut s);
            s
        }
        _ => v.to_string(),
    }
}

/// The environment's formatter: print values as Python's `str()` does, with no auto-escaping
/// (transformers' sandboxed environment does not escape).
pub(crate) fn formatter(
    out: &mut minijinja::Output,
    _state: &State,
    value: &Value,
) -> Result<(), JError> {
    out.write_str(&py_str(value))
        .map_err(|e| JError::new(ErrorKind::WriteFailure, "writing template output").with_source(e))
}

/// Options of Python's `json.dumps` as transformers' `tojson` filter exposes them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JsonOptions {
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(s)`: newline and `s` repeated per nesting level.
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
}

impl Default for JsonOptions {
    fn default() -> Self {
        JsonOptions {
            ensure_ascii: false,
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            sort_keys: false,
        }
    }
}

fn json_escape_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_key(key: &Value) -> Result<String, JError> {
    // json.dumps turns str/int/float/bool/None keys into strings; anything else is a TypeError.
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::Number => number_str(key),
        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.into(),
        ValueKind::None => "null".into(),
        other => {
            return Err(JError::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be str, int, float, bool or None, not {other}"),
            ))
        }
    })
}

fn json_newline(opts: &JsonOptions, level: usize, out: &mut String) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn json_into(v: &Value, opts: &JsonOptions, level: usize, out: &mut String) -> Result<(), JError> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f = f64::try_from(v.clone())?;
                if f.is_nan() {
                    out.push_str("NaN");
                } else if f.is_infinite() {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                } else {
                    out.push_str(&py_float_repr(f));
                }
            }
        }
        ValueKind::String => {
            json_escape_str(v.as_str().unwrap_or_default(), opts.ensure_ascii, out)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                json_newline(opts, level + 1, out);
                json_into(item, opts, level + 1, out)?;
            }
            json_newline(opts, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut pairs: Vec<(String, Value)> = Vec::new();
            for key in v.try_iter()? {
                let value = v.get_item(&key)?;
                pairs.push((json_key(&key)?, value));
            }
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (key, value)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                json_newline(opts, level + 1, out);
                json_escape_str(key, opts.ensure_ascii, out);
                out.push_str(&opts.key_sep);
                json_into(value, opts, level + 1, out)?;
            }
            json_newline(opts, level, out);
            out.push('}');
        }
        other => {
            return Err(JError::new(
                ErrorKind::InvalidOperation,
                format!("tojson: object of type {other} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// `json.dumps(value, ...)` with Python's exact spacing, escaping and float formatting.
pub(crate) fn json_dumps(v: &Value, opts: &JsonOptions) -> Result<String, JError> {
    let mut out = String::new();
    json_into(v, opts, 0, &mut out)?;
    Ok(out)
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
pub(crate) fn tojson_filter(
    value: &Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<Value, JError> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(JError::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 positional arguments",
        ));
    }
    let mut slots: [Option<Value>; 4] = Default::default();
    for (slot, arg) in slots.iter_mut().zip(args.iter()) {
        *slot = Some(arg.clone());
    }
    for (i, name) in NAMES.iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            if slots[i].is_some() {
                return Err(JError::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson got multiple values for argument `{name}`"),
                ));
            }
            slots[i] = Some(v);
        }
    }
    kwargs.assert_all_used()?;
    let given = |v: &Option<Value>| {
        v.as_ref()
            .filter(|v| !v.is_none() && !v.is_undefined())
            .cloned()
    };

    let mut opts = JsonOptions {
        ensure_ascii: slots[0].as_ref().is_some_and(|v| v.is_true()),
        ..JsonOptions::default()
    };
    if let Some(indent) = given(&slots[1]) {
        opts.indent = Some(match indent.kind() {
            ValueKind::String => indent.as_str().unwrap_or_default().to_string(),
            ValueKind::Number => {
                let n = i64::try_from(indent.clone())?;
                " ".repeat(n.max(0) as usize)
            }
            other => {
                return Err(JError::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: indent must be an int or a string, not {other}"),
                ))
            }
        });
        opts.item_sep = ",".into();
    }
    if let Some(seps) = given(&slots[2]) {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        match parts.as_slice() {
            [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                opts.item_sep = a.as_str().unwrap_or_default().to_string();
                opts.key_sep = b.as_str().unwrap_or_default().to_string();
            }
            _ => {
                return Err(JError::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair of strings",
                ))
            }
        }
    }
    opts.sort_keys = slots[3].as_ref().is_some_and(|v| v.is_true());
    json_dumps(value, &opts).map(Value::from_safe_string)
}

/// Jinja2's `trim(value, chars=None)`: Python `str.strip`.
pub(crate) fn trim_filter(value: &Value, chars: Option<String>) -> Result<Value, JError> {
    let s = py_str(value);
    Ok(Value::from(py_strip(&s, chars.as_deref(), true, true)))
}

/// Jinja2's `length` / `count`: Python `len()`; Jinja2's Undefined has length 0.
pub(crate) fn length_filter(value: &Value) -> Result<Value, JError> {
    if value.is_undefined() {
        return Ok(Value::from(0));
    }
    if let Some(s) = value.as_str() {
        return Ok(Value::from(s.chars().count()));
    }
    value.len().map(Value::from).ok_or_else(|| {
        JError::new(
            ErrorKind::InvalidOperation,
            format!("object of type {} has no len()", value.kind()),
        )
    })
}

/// Jinja2's `upper`: `str(value).upper()` (a list prints as its Python repr first).
pub(crate) fn upper_filter(value: &Value) -> String {
    py_str(value).to_uppercase()
}

/// Jinja2's `lower`: `str(value).lower()`.
pub(crate) fn lower_filter(value: &Value) -> String {
    py_str(value).to_lowercase()
}

/// Jinja2's `join(value, d='', attribute=None)`: items printed with Python's `str()`.
pub(crate) fn join_filter(
    value: &Value,
    d: Option<String>,
    attribute: Option<Value>,
    kwargs: Kwargs,
) -> Result<String, JError> {
    let sep = match d {
        Some(d) => d,
        None => kwargs.get::<Option<String>>("d")?.unwrap_or_default(),
    };
    let attribute = match attribute {
        Some(a) => Some(a),
        None => kwargs.get::<Option<Value>>("attribute")?,
    };
    kwargs.assert_all_used()?;
    let mut parts = Vec::new();
    for item in value.try_iter()? {
        let item = match &attribute {
            None => item,
            Some(attr) => match attr.as_str() {
                Some(name) => name
                    .split('.')
                    .try_fold(item, |v, key| v.get_item(&Value::from(key)))?,
                None => item.get_item(attr)?,
            },
        };
        parts.push(py_str(&item));
    }
    Ok(parts.join(&sep))
}

/// Jinja2's `sequence` test: anything with a length and item access (str, list, dict).
pub(crate) fn is_sequence(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::Seq | ValueKind::String | ValueKind::Map | ValueKind::Bytes
    )
}

/// Jinja2's `iterable` test: `iter(value)` works (str, list, dict, and Jinja2's Undefined; not
/// None or numbers).
pub(crate) fn is_iterable(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::Seq
            | ValueKind::String
            | ValueKind::Map
            | ValueKind::Bytes
            | ValueKind::Iterable
            | ValueKind::Undefined
    )
}

/// Python string methods minijinja lacks or gets subtly wrong, then minijinja-contrib's pycompat.
pub(crate) fn unknown_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, JError> {
    if let Some(s) = value.as_str() {
        let side = match method {
            "strip" => Some((true, true)),
            "lstrip" => Some((true, false)),
            "rstrip" => Some((false, true)),
            _ => None,
        };
        if let Some((left, right)) = side {
            let chars = match args {
                [] => None,
                [c] if c.is_none() => None,
                [c] => Some(c.as_str().ok_or_else(|| {
                    JError::new(
                        ErrorKind::InvalidOperation,
                        format!("{method}() arg must be str or None"),
                    )
                })?),
                _ => return Err(JError::from(ErrorKind::TooManyArguments)),
            };
            return Ok(Value::from(py_strip(s, chars, left, right)));
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// `raise_exception(message)`: abort rendering with the template's message.
pub(crate) fn raise_exception(message: String) -> Result<Value, JError> {
    Err(JError::new(ErrorKind::InvalidOperation, message))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// C `strftime` (glibc, C locale) for a UTC time given as seconds since the Unix epoch.
/// Supports the directives chat templates use; unknown directives are copied through.
pub(crate) fn strftime_utc(fmt: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday (Monday = 0)
    const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[(month - 1) as usize] + day + u32::from(month > 2 && is_leap(year));
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        // glibc's `-` flag: no padding.
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let num = |n: i64, width: usize| {
            if unpadded {
                n.to_string()
            } else {
                format!("{n:0width$}")
            }
        };
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&num(year.rem_euclid(100), 2)),
            Some('m') => out.push_str(&num(month.into(), 2)),
            Some('d') => out.push_str(&num(day.into(), 2)),
            Some('e') => out.push_str(&if unpadded {
                day.to_string()
            } else {
                format!("{day:2}")
            }),
            Some('H') => out.push_str(&num(hour, 2)),
            Some('I') => out.push_str(&num(hour12, 2)),
            Some('M') => out.push_str(&num(minute, 2)),
            Some('S') => out.push_str(&num(second, 2)),
            Some('j') => out.push_str(&num(yday.into(), 3)),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('b') | Some('h') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('A') => out.push_str(WEEKDAYS[weekday]),
            Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
            Some('u') => out.push_str(&(weekday + 1).to_string()),
            Some('w') => out.push_str(&((weekday + 1) % 7).to_string()),
            Some('F') => {
                let _ = write!(out, "{year}-{month:02}-{day:02}");
            }
            Some('D') => {
                let _ = write!(out, "{month:02}/{day:02}/{:02}", year.rem_euclid(100));
            }
            Some('T') => {
                let _ = write!(out, "{hour:02}:{minute:02}:{second:02}");
            }
            Some('R') => {
                let _ = write!(out, "{hour:02}:{minute:02}");
            }
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `strftime_now(format)`: the current time, formatted. Python uses local time; dg uses UTC
/// (the same on a machine whose zone is UTC).
pub(crate) fn strftime_now(format: String) -> Result<Value, JError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Ok(Value::from(strftime_utc(&format, now)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn goldens() -> serde_json::Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/goldens/tokenize.json"
        );
        let text = std::fs::read_to_string(path).expect("tokenize.json");
        serde_json::from_str(&text).expect("json")
    }

    #[test]
    fn float_repr_matches_python() {
        let g = goldens();
        let cases = g["float_repr"].as_array().expect("float_repr cases");
        assert!(cases.len() >= 10);
        for c in cases {
            let x = c["value"].as_f64().unwrap();
            assert_eq!(py_float_repr(x), c["repr"].as_str().unwrap(), "{x:e}");
        }
    }

    #[test]
    fn strftime_matches_glibc_goldens() {
        let g = goldens();
        let cases = g["strftime"].as_array().expect("strftime cases");
        assert!(cases.len() >= 5);
        for c in cases {
            let fmt = c["format"].as_str().unwrap();
            let t = c["unix"].as_i64().unwrap();
            assert_eq!(
                strftime_utc(fmt, t),
                c["text"].as_str().unwrap(),
                "{fmt} @ {t}"
            );
        }
    }
}
