//! Reading the TOML of the scenario kinds that have their own format (`kind =
//! "credit"`, `kind = "overlay"`): keys checked against a list, numbers in a range,
//! and every error naming the file and the key's path.

use toml::{Table, Value};

use crate::scenario::ScenarioError;

pub(crate) fn err(file: &str, key: Option<&str>, message: &str) -> ScenarioError {
    ScenarioError {
        file: file.into(),
        key: key.map(Into::into),
        message: message.into(),
    }
}

/// Where we are in a file: its name and the key path so far (e.g. `link[2].`).
pub(crate) struct Cx<'a> {
    pub file: &'a str,
    pub at: String,
}

impl Cx<'_> {
    pub(crate) fn sub(&self, at: &str) -> Cx<'_> {
        Cx {
            file: self.file,
            at: format!("{}{at}", self.at),
        }
    }
    pub(crate) fn e(&self, key: &str, message: &str) -> ScenarioError {
        err(self.file, Some(&format!("{}{key}", self.at)), message)
    }
    pub(crate) fn check(&self, t: &Table, allowed: &[&str]) -> Result<(), ScenarioError> {
        match t.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(self.e(
                k,
                &format!("unknown key; expected one of: {}", allowed.join(", ")),
            )),
            None => Ok(()),
        }
    }
    pub(crate) fn num(
        &self,
        t: &Table,
        key: &str,
        default: Option<f64>,
        lo: f64,
        hi: f64,
    ) -> Result<f64, ScenarioError> {
        let v = match t.get(key) {
            None => return default.ok_or_else(|| self.e(key, "required")),
            Some(Value::Integer(i)) => *i as f64,
            Some(Value::Float(f)) => *f,
            Some(other) => return Err(self.e(key, &format!("expected a number, found {other}"))),
        };
        if !(lo..=hi).contains(&v) {
            return Err(self.e(key, &format!("expected a number in {lo}..={hi}, found {v}")));
        }
        Ok(v)
    }
    pub(crate) fn int(
        &self,
        t: &Table,
        key: &str,
        default: Option<u64>,
        lo: u64,
        hi: u64,
    ) -> Result<u64, ScenarioError> {
        let v = self.num(t, key, default.map(|d| d as f64), lo as f64, hi as f64)?;
        if v.fract() != 0.0 {
            return Err(self.e(key, &format!("expected a whole number, found {v}")));
        }
        Ok(v as u64)
    }
    pub(crate) fn string<'t>(
        &self,
        t: &'t Table,
        key: &str,
    ) -> Result<Option<&'t str>, ScenarioError> {
        match t.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.e(key, &format!("expected a string, found {other}"))),
        }
    }
    pub(crate) fn node(
        &self,
        t: &Table,
        key: &str,
        nodes: &[String],
    ) -> Result<usize, ScenarioError> {
        let name = self
            .string(t, key)?
            .ok_or_else(|| self.e(key, "required"))?;
        nodes.iter().position(|n| n == name).ok_or_else(|| {
            self.e(
                key,
                &format!(
                    "unknown node \"{name}\"; the nodes are: {}",
                    nodes.join(", ")
                ),
            )
        })
    }
    pub(crate) fn tables<'t>(
        &self,
        t: &'t Table,
        key: &str,
    ) -> Result<Vec<&'t Table>, ScenarioError> {
        match t.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_table()
                        .ok_or_else(|| self.e(key, &format!("expected [[{key}]] tables")))
                })
                .collect(),
            Some(_) => Err(self.e(key, &format!("expected [[{key}]] tables"))),
        }
    }
    pub(crate) fn table<'t>(
        &self,
        t: &'t Table,
        key: &str,
    ) -> Result<Option<&'t Table>, ScenarioError> {
        match t.get(key) {
            None => Ok(None),
            Some(Value::Table(x)) => Ok(Some(x)),
            Some(_) => Err(self.e(key, &format!("expected a [{key}] table"))),
        }
    }
}
