//! A JSON reader for the vectors files, by hand as the writer in
//! `tests/vectors.rs` is (the crate has no serde). It reads what a client
//! writer's JSON library would: objects keep every key, in order, so a key
//! given twice is seen twice and a field left out is missed.

/// A JSON value. Numbers are the vectors' unsigned integers.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Num(u64),
    Str(String),
    Arr(Vec<Value>),
    /// Keys in the order of the text.
    Obj(Vec<(String, Value)>),
}

impl Value {
    /// The value of `key` in an object; `None` if there is none (or this
    /// is no object).
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Obj(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Parses a whole JSON text.
pub fn parse(text: &str) -> Result<Value, String> {
    let mut p = Parser { s: text.as_bytes(), at: 0 };
    let v = p.value()?;
    p.space();
    if p.at != p.s.len() {
        return Err(p.error("text after the value"));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> String {
        format!("JSON: {what} at byte {}", self.at)
    }

    fn space(&mut self) {
        while self.s.get(self.at).is_some_and(|b| b.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.space();
        let hit = self.s.get(self.at) == Some(&b);
        self.at += usize::from(hit);
        hit
    }

    fn word(&mut self, w: &str, v: Value) -> Result<Value, String> {
        if !self.s[self.at..].starts_with(w.as_bytes()) {
            return Err(self.error("an unknown word"));
        }
        self.at += w.len();
        Ok(v)
    }

    fn value(&mut self) -> Result<Value, String> {
        self.space();
        match self.s.get(self.at) {
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => Ok(Value::Str(self.string()?)),
            Some(b't') => self.word("true", Value::Bool(true)),
            Some(b'f') => self.word("false", Value::Bool(false)),
            Some(b'n') => self.word("null", Value::Null),
            Some(b'0'..=b'9') => self.number(),
            _ => Err(self.error("no value")),
        }
    }

    fn number(&mut self) -> Result<Value, String> {
        let start = self.at;
        while self.s.get(self.at).is_some_and(u8::is_ascii_digit) {
            self.at += 1;
        }
        if matches!(self.s.get(self.at), Some(b'.' | b'e' | b'E')) {
            return Err(self.error("a number that is not an integer"));
        }
        let digits = std::str::from_utf8(&self.s[start..self.at]).map_err(|_| self.error("digits"))?;
        digits.parse().map(Value::Num).map_err(|_| self.error("an integer past u64"))
    }

    fn string(&mut self) -> Result<String, String> {
        if !self.eat(b'"') {
            return Err(self.error("no string"));
        }
        let mut out = String::new();
        loop {
            let start = self.at;
            while self.s.get(self.at).is_some_and(|&b| b != b'"' && b != b'\\') {
                self.at += 1;
            }
            out.push_str(std::str::from_utf8(&self.s[start..self.at]).map_err(|_| self.error("not UTF-8"))?);
            match self.s.get(self.at) {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b'\\') => out.push(self.escape()?),
                _ => return Err(self.error("a string that never ends")),
            }
        }
    }

    /// The character of the escape at `self.at` (a backslash).
    fn escape(&mut self) -> Result<char, String> {
        let c = *self.s.get(self.at + 1).ok_or_else(|| self.error("an escape that never ends"))?;
        self.at += 2;
        Ok(match c {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'n' => '\n',
            b't' => '\t',
            b'r' => '\r',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'u' => {
                let hex = self.s.get(self.at..self.at + 4).ok_or_else(|| self.error("a short \\u escape"))?;
                let hex = std::str::from_utf8(hex).map_err(|_| self.error("a bad \\u escape"))?;
                let code = u32::from_str_radix(hex, 16).map_err(|_| self.error("a bad \\u escape"))?;
                self.at += 4;
                char::from_u32(code).ok_or_else(|| self.error("a \\u escape of no character"))?
            }
            _ => return Err(self.error("an unknown escape")),
        })
    }

    fn array(&mut self) -> Result<Value, String> {
        self.at += 1;
        let mut items = Vec::new();
        if self.eat(b']') {
            return Ok(Value::Arr(items));
        }
        loop {
            items.push(self.value()?);
            if self.eat(b']') {
                return Ok(Value::Arr(items));
            }
            if !self.eat(b',') {
                return Err(self.error("no comma in an array"));
            }
        }
    }

    fn object(&mut self) -> Result<Value, String> {
        self.at += 1;
        let mut fields = Vec::new();
        if self.eat(b'}') {
            return Ok(Value::Obj(fields));
        }
        loop {
            self.space();
            let key = self.string()?;
            if !self.eat(b':') {
                return Err(self.error("no colon after a key"));
            }
            fields.push((key, self.value()?));
            if self.eat(b'}') {
                return Ok(Value::Obj(fields));
            }
            if !self.eat(b',') {
                return Err(self.error("no comma in an object"));
            }
        }
    }
}
