//! The one `${VAR}` expander: a header template (`--header`, `--server-metrics-header`)
//! parsed once into literal and variable parts, for listing the variables it reads (a
//! worker's `--allow-env` check, the variables local workers are given) and for expanding it
//! with a lookup (the worker's or the coordinator's own environment).
//!
//! `${` opens a variable and the next `}` closes it; there is no escape and no default
//! (`${VAR:-x}` names the variable `VAR:-x`). Errors never show the template or a value: a
//! header template often holds a secret written out.

/// One piece of a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part<'a> {
    /// Text copied as it is.
    Literal(&'a str),
    /// `${NAME}`: the variable's name.
    Var(&'a str),
}

/// A problem with a template or its expansion. Neither variant holds the template's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvTemplateError {
    /// A `${` never closed; `column` is its position in the template, in characters from 1.
    #[error("a ${{ at character {column} has no closing }} (the value is not shown)")]
    Unterminated { column: usize },
    /// A variable the lookup does not have.
    #[error("${{{var}}} is not set in this process's environment")]
    Unset { var: String },
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvTemplate<'a> {
    parts: Vec<Part<'a>>,
}

impl<'a> EnvTemplate<'a> {
    /// Parse `template`: `Err(Unterminated)` for a `${` without its `}`.
    pub fn parse(template: &'a str) -> Result<EnvTemplate<'a>, EnvTemplateError> {
        let mut parts = Vec::new();
        let mut rest = template;
        let mut offset = 0;
        while let Some(start) = rest.find("${") {
            if start > 0 {
                parts.push(Part::Literal(&rest[..start]));
            }
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                let column = template[..offset + start].chars().count() + 1;
                return Err(EnvTemplateError::Unterminated { column });
            };
            parts.push(Part::Var(&after[..end]));
            let consumed = start + 2 + end + 1;
            offset += consumed;
            rest = &rest[consumed..];
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest));
        }
        Ok(EnvTemplate { parts })
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[Part<'a>] {
        &self.parts
    }

    /// The variables read, in order (repeats kept).
    pub fn vars(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.parts.iter().filter_map(|part| match part {
            Part::Var(name) => Some(*name),
            Part::Literal(_) => None,
        })
    }

    /// The template with each variable replaced by `lookup`'s value; `Err(Unset)` names the
    /// first variable `lookup` does not have.
    pub fn expand(
        &self,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<String, EnvTemplateError> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Var(var) => {
                    let value = lookup(var).ok_or_else(|| EnvTemplateError::Unset {
                        var: (*var).to_owned(),
                    })?;
                    out.push_str(&value);
                }
            }
        }
        Ok(out)
    }
}

/// Parse and expand `template` with `lookup` in one step.
pub fn expand(
    template: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, EnvTemplateError> {
    EnvTemplate::parse(template)?.expand(lookup)
}

/// The variables `template` reads, in order: `Err(Unterminated)` for a `${` never closed.
pub fn vars(template: &str) -> Result<Vec<String>, EnvTemplateError> {
    Ok(EnvTemplate::parse(template)?
        .vars()
        .map(str::to_owned)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(var: &str) -> Option<String> {
        match var {
            "KEY" => Some("s3cret".to_owned()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn a_template_parses_into_literals_and_variables() {
        let template = EnvTemplate::parse("Bearer ${KEY}-${TEAM}${ENV}!").expect("parses");
        assert_eq!(
            template.parts(),
            [
                Part::Literal("Bearer "),
                Part::Var("KEY"),
                Part::Literal("-"),
                Part::Var("TEAM"),
                Part::Var("ENV"),
                Part::Literal("!"),
            ]
        );
        assert_eq!(template.vars().collect::<Vec<_>>(), ["KEY", "TEAM", "ENV"]);
        assert!(EnvTemplate::parse("").expect("empty").parts().is_empty());
        // A lone `$` or `}` is literal text.
        assert_eq!(
            EnvTemplate::parse("a$b}c").expect("parses").parts(),
            [Part::Literal("a$b}c")]
        );
    }

    #[test]
    fn expansion_replaces_variables_and_names_an_unset_one() {
        assert_eq!(
            expand("Bearer ${KEY}", &lookup).as_deref(),
            Ok("Bearer s3cret")
        );
        assert_eq!(expand("x${EMPTY}y", &lookup).as_deref(), Ok("xy"));
        assert_eq!(expand("plain", &lookup).as_deref(), Ok("plain"));
        let error = expand("Bearer ${KEY} ${OTHER}", &lookup).expect_err("unset");
        assert_eq!(
            error,
            EnvTemplateError::Unset {
                var: "OTHER".to_owned()
            }
        );
        assert_eq!(
            error.to_string(),
            "${OTHER} is not set in this process's environment"
        );
    }

    #[test]
    fn an_unterminated_variable_is_one_error_that_shows_no_value() {
        let template = "Bearer sk-live-123 ${KEY} ${OPEN";
        let error = EnvTemplate::parse(template).expect_err("unterminated");
        assert_eq!(error, EnvTemplateError::Unterminated { column: 27 });
        let text = error.to_string();
        assert_eq!(
            text,
            "a ${ at character 27 has no closing } (the value is not shown)"
        );
        assert!(
            !text.contains("sk-live") && !text.contains("OPEN"),
            "{text}"
        );
        // Listing and expanding refuse it alike.
        assert_eq!(vars(template), Err(error.clone()));
        assert_eq!(expand(template, &lookup), Err(error));
        assert_eq!(vars("${A}${B}").expect("lists"), ["A", "B"]);
    }
}
