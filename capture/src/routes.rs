//! The route table of `--upstream` (repeatable): which [`Upstream`] serves a request, in
//! the shape of an Envoy virtual host or an nginx `location`.
//!
//! Three forms of the flag:
//! - `URL` — the default upstream (at most one), for requests no other route takes;
//! - `/PREFIX=URL` — a path prefix, matched on whole path segments (`/openai` takes `/openai`
//!   and `/openai/v1/...`, not `/openaix`); the longest matching prefix wins, and it is
//!   stripped before the request is forwarded (the upstream URL's own path, if any, is then
//!   put before what is left, as for the default);
//! - `HOST=URL` — the request's `Host` (HTTP/1.1) or `:authority` (HTTP/2), port ignored,
//!   any case, for clients that use the proxy as the base URL under a per-provider host name.
//!
//! A host route is tried first (the path is forwarded whole), then the prefixes, longest
//! first, then the default. Each route has a name the recording and `/metrics` use: the
//! prefix without its leading slash (`openai`), the host, or `default`.

use http::Uri;

/// The name of the default route (a bare `--upstream URL`).
pub const DEFAULT_ROUTE: &str = "default";

/// What a route matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteMatch {
    /// Every request no other route takes.
    Default,
    /// A path prefix (leading slash, no trailing one), matched on whole segments.
    Prefix(String),
    /// A host name, lower-case, without a port.
    Host(String),
}

/// One route: its name, what it matches and where it sends.
#[derive(Debug, Clone)]
pub struct Route {
    /// `openai` (prefix `/openai`), `api.openai.local` (a host) or `default`.
    pub name: String,
    pub matcher: RouteMatch,
    pub upstream: Upstream,
}

/// The upstream: scheme and authority, and a path prefix put before every request's path.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub scheme: http::uri::Scheme,
    pub authority: http::uri::Authority,
    pub base_path: String,
}

impl Upstream {
    /// Parse `http(s)://host[:port][/prefix]`; an error names `--upstream`.
    pub fn parse(url: &str) -> Result<Upstream, String> {
        Upstream::parse_url(url).map_err(|e| format!("--upstream {url:?}: {e}"))
    }

    /// Parse `http(s)://host[:port][/prefix]`; the error says what is wrong only.
    pub fn parse_url(url: &str) -> Result<Upstream, String> {
        let uri: Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| "expected http:// or https://".to_owned())?;
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            return Err("expected http:// or https://".to_owned());
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| "no host".to_owned())?;
        Ok(Upstream {
            scheme,
            authority,
            base_path: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    /// `scheme://host[:port]`, as messages name the upstream (without any user info or
    /// path prefix).
    pub fn display(&self) -> String {
        let host = self.authority.host();
        match self.authority.port_u16() {
            Some(port) => format!("{}://{host}:{port}", self.scheme),
            None => format!("{}://{host}", self.scheme),
        }
    }

    /// [`Upstream::display`] and the path prefix: the base URL as the recording names it.
    pub fn display_with_path(&self) -> String {
        format!("{}{}", self.display(), self.base_path)
    }

    /// `host:port` to open a TCP connection to (the scheme's port when none is given).
    pub fn socket_address(&self) -> String {
        let default_port = if self.scheme == http::uri::Scheme::HTTPS {
            443
        } else {
            80
        };
        let port = self.authority.port_u16().unwrap_or(default_port);
        format!("{}:{port}", self.authority.host())
    }

    pub(crate) fn uri_for(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(format!("{}{}", self.base_path, path_and_query))
            .build()
    }
}

/// Every `--upstream` route, in the order they are tried: hosts, prefixes longest first,
/// the default.
#[derive(Debug, Clone)]
pub struct Routes {
    routes: Vec<Route>,
}

impl Routes {
    /// The table of a lone default upstream (`--upstream URL`, as before routes existed).
    pub fn single(upstream: Upstream) -> Routes {
        Routes {
            routes: vec![Route {
                name: DEFAULT_ROUTE.to_owned(),
                matcher: RouteMatch::Default,
                upstream,
            }],
        }
    }

    /// Parse every `--upstream` value; an error names the flag value and what is wrong.
    pub fn parse(specs: &[String]) -> Result<Routes, String> {
        if specs.is_empty() {
            return Err("--upstream: at least one is needed (URL, /PREFIX=URL or HOST=URL)".into());
        }
        let mut routes: Vec<Route> = Vec::with_capacity(specs.len());
        for spec in specs {
            let route = parse_route(spec)?;
            if let Some(other) = routes.iter().find(|r| r.matcher == route.matcher) {
                let what = match &route.matcher {
                    RouteMatch::Default => "a second default upstream (at most one bare URL)",
                    RouteMatch::Prefix(_) => "the same path prefix twice",
                    RouteMatch::Host(_) => "the same host twice",
                };
                return Err(format!(
                    "--upstream {spec:?}: {what}; already given by --upstream for {}",
                    other.describe()
                ));
            }
            if let Some(other) = routes.iter().find(|r| r.name == route.name) {
                return Err(format!(
                    "--upstream {spec:?}: the route name {:?} is already that of {}; \
                     names (prefix without its slash, host, `default`) must differ",
                    route.name,
                    other.describe()
                ));
            }
            routes.push(route);
        }
        routes.sort_by_key(|route| match &route.matcher {
            RouteMatch::Host(_) => (0, 0),
            RouteMatch::Prefix(prefix) => (1, usize::MAX - prefix.len()),
            RouteMatch::Default => (2, 0),
        });
        Ok(Routes { routes })
    }

    /// The routes in the order they are tried.
    pub fn iter(&self) -> impl Iterator<Item = &Route> {
        self.routes.iter()
    }

    /// More than a lone default: each recorded exchange names its upstream.
    pub fn names_upstreams(&self) -> bool {
        !matches!(self.routes.as_slice(), [only] if only.matcher == RouteMatch::Default)
    }

    /// The route of a request to `host` (a `Host` or `:authority` value, port and all) and
    /// `path_and_query`, and the path and query forwarded and recorded (the client's less
    /// the route's prefix); `None` when no route takes it.
    pub fn lookup(&self, host: Option<&str>, path_and_query: &str) -> Option<(&Route, String)> {
        let host = host.map(host_without_port);
        let (path, query) = match path_and_query.find('?') {
            Some(at) => path_and_query.split_at(at),
            None => (path_and_query, ""),
        };
        for route in &self.routes {
            let forwarded = match &route.matcher {
                RouteMatch::Host(name) => host
                    .filter(|h| h.eq_ignore_ascii_case(name))
                    .map(|_| path_and_query.to_owned()),
                RouteMatch::Prefix(prefix) => strip_prefix(path, prefix).map(|rest| {
                    let rest = if rest.is_empty() { "/" } else { rest };
                    format!("{rest}{query}")
                }),
                RouteMatch::Default => Some(path_and_query.to_owned()),
            };
            if let Some(forwarded) = forwarded {
                return Some((route, forwarded));
            }
        }
        None
    }

    /// The routes as the no-route answer and `/readyz` name them:
    /// `/openai → http://10.0.0.5:8000, host api.local → https://api.example.com`.
    pub fn describe(&self) -> String {
        self.routes
            .iter()
            .map(Route::describe)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl Route {
    /// `/openai → http://host:port`, `host api.local → …`, `default → …` (no user info).
    pub fn describe(&self) -> String {
        let upstream = self.upstream.display_with_path();
        match &self.matcher {
            RouteMatch::Default => format!("default → {upstream}"),
            RouteMatch::Prefix(prefix) => format!("{prefix} → {upstream}"),
            RouteMatch::Host(host) => format!("host {host} → {upstream}"),
        }
    }
}

/// One `--upstream` value.
fn parse_route(spec: &str) -> Result<Route, String> {
    let trimmed = spec.trim();
    let lower = trimmed.to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        return Ok(Route {
            name: DEFAULT_ROUTE.to_owned(),
            matcher: RouteMatch::Default,
            upstream: Upstream::parse(trimmed)?,
        });
    }
    let Some((key, url)) = trimmed.split_once('=') else {
        return Err(format!(
            "--upstream {spec:?}: expected a URL (http:// or https://), /PREFIX=URL or HOST=URL"
        ));
    };
    let upstream =
        Upstream::parse_url(url.trim()).map_err(|e| format!("--upstream {spec:?}: {e}"))?;
    let key = key.trim();
    if key.starts_with('/') {
        let prefix = key.trim_end_matches('/');
        if prefix.is_empty() {
            return Err(format!(
                "--upstream {spec:?}: empty path prefix (give the default upstream as a bare URL)"
            ));
        }
        if prefix.contains(['?', '#', ' ']) || prefix.contains("//") {
            return Err(format!(
                "--upstream {spec:?}: a path prefix is /segment[/segment...], without ?, # or spaces"
            ));
        }
        return Ok(Route {
            name: prefix.trim_start_matches('/').to_owned(),
            matcher: RouteMatch::Prefix(prefix.to_owned()),
            upstream,
        });
    }
    if key.is_empty() {
        return Err(format!(
            "--upstream {spec:?}: nothing before `=` (expected /PREFIX=URL or HOST=URL)"
        ));
    }
    if !key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err(format!(
            "--upstream {spec:?}: {key:?} is not a host name (letters, digits, `-`, `.`; \
             no port: the port is ignored when matching) nor a /PREFIX"
        ));
    }
    let host = key.trim_end_matches('.').to_ascii_lowercase();
    Ok(Route {
        name: host.clone(),
        matcher: RouteMatch::Host(host),
        upstream,
    })
}

/// `path` less `prefix` when `prefix` is a whole-segment prefix of it (`/openai` of
/// `/openai` and `/openai/v1`, not of `/openaix`).
fn strip_prefix<'p>(path: &'p str, prefix: &str) -> Option<&'p str> {
    let rest = path.strip_prefix(prefix)?;
    (rest.is_empty() || rest.starts_with('/')).then_some(rest)
}

/// The host of a `Host` value: `api.local:8080` → `api.local`, `[::1]:80` → `[::1]`, with a
/// trailing dot dropped.
fn host_without_port(value: &str) -> &str {
    let value = value.trim();
    let host = if value.starts_with('[') {
        value.find(']').map_or(value, |end| &value[..=end])
    } else {
        value.rsplit_once(':').map_or(value, |(host, _)| host)
    };
    host.strip_suffix('.').unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(specs: &[&str]) -> Routes {
        Routes::parse(&specs.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
            .expect("valid routes")
    }

    fn error(specs: &[&str]) -> String {
        Routes::parse(&specs.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
            .expect_err("invalid routes")
    }

    /// (route name, forwarded path), or `None`.
    fn route_of(table: &Routes, host: Option<&str>, path: &str) -> Option<(String, String)> {
        table
            .lookup(host, path)
            .map(|(route, forwarded)| (route.name.clone(), forwarded))
    }

    fn some(name: &str, path: &str) -> Option<(String, String)> {
        Some((name.to_owned(), path.to_owned()))
    }

    #[test]
    fn a_bare_url_is_the_lone_default_and_forwards_every_path_whole() {
        let table = routes(&["http://127.0.0.1:8000/v1"]);
        assert!(!table.names_upstreams());
        assert_eq!(
            route_of(&table, Some("anything:1"), "/chat/completions?x=1"),
            some("default", "/chat/completions?x=1")
        );
        let route = table.iter().next().expect("one route");
        assert_eq!(route.upstream.base_path, "/v1");
    }

    #[test]
    fn prefixes_match_whole_segments_longest_first_and_are_stripped() {
        let table = routes(&[
            "/openai=http://a:1",
            "/openai/v2=http://b:2/base",
            "/anthropic/=https://c",
        ]);
        assert!(table.names_upstreams());
        assert_eq!(
            route_of(&table, None, "/openai/v1/chat/completions"),
            some("openai", "/v1/chat/completions")
        );
        assert_eq!(route_of(&table, None, "/openai"), some("openai", "/"));
        assert_eq!(
            route_of(&table, None, "/openai?stream=1"),
            some("openai", "/?stream=1")
        );
        // The longer prefix wins, whatever the order given.
        assert_eq!(
            route_of(&table, None, "/openai/v2/models?limit=2"),
            some("openai/v2", "/models?limit=2")
        );
        assert_eq!(
            route_of(&table, None, "/openai/v2x"),
            some("openai", "/v2x")
        );
        // A trailing slash on the flag's prefix is the same prefix.
        assert_eq!(
            route_of(&table, None, "/anthropic/v1/messages"),
            some("anthropic", "/v1/messages")
        );
        // Not a whole segment, and no default: no route.
        assert_eq!(route_of(&table, None, "/openaix/v1"), None);
        assert_eq!(route_of(&table, None, "/v1/chat/completions"), None);
    }

    #[test]
    fn hosts_match_without_port_in_any_case_before_prefixes_then_the_default() {
        let table = routes(&[
            "http://fallback:9",
            "/openai=http://a:1",
            "API.OpenAI.local=http://h:3",
        ]);
        assert_eq!(
            route_of(&table, Some("api.openai.LOCAL:8080"), "/openai/v1/models"),
            some("api.openai.local", "/openai/v1/models")
        );
        assert_eq!(
            route_of(&table, Some("api.openai.local."), "/v1/models"),
            some("api.openai.local", "/v1/models")
        );
        assert_eq!(
            route_of(&table, Some("127.0.0.1:8080"), "/openai/v1/models"),
            some("openai", "/v1/models")
        );
        assert_eq!(
            route_of(&table, Some("[::1]:8080"), "/v1/models"),
            some("default", "/v1/models")
        );
        assert_eq!(route_of(&table, None, "/x"), some("default", "/x"));
        let order: Vec<&str> = table.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(order, ["api.openai.local", "openai", "default"]);
    }

    #[test]
    fn bad_specs_are_errors_naming_the_value() {
        for (specs, expected) in [
            (
                vec!["/a=http://x", "/a/=http://y"],
                "same path prefix twice",
            ),
            (vec!["http://x", "https://y"], "second default"),
            (
                vec!["h.local=http://x", "H.LOCAL=http://y"],
                "same host twice",
            ),
            (vec!["/=http://x"], "empty path prefix"),
            (vec!["=http://x"], "nothing before `=`"),
            (vec!["/a=ftp://x"], "expected http:// or https://"),
            (vec!["/a=not a url"], "not a URL"),
            (vec!["example.com"], "expected a URL"),
            (vec!["host:8080=http://x"], "not a host name"),
            (vec!["/a?b=http://x"], "without ?"),
            (vec!["/openai=http://x", "openai=http://y"], "route name"),
            (vec!["/default=http://x", "http://y"], "route name"),
        ] {
            let message = error(&specs);
            assert!(
                message.contains(expected),
                "{specs:?}: {message:?} lacks {expected:?}"
            );
            let last = specs.last().expect("a spec");
            assert!(
                message.contains(&format!("{last:?}")) || message.contains(specs[0]),
                "{specs:?}: the message names no flag value: {message:?}"
            );
        }
        assert!(error(&[]).contains("at least one"));
    }

    #[test]
    fn routes_are_described_without_user_info() {
        let table = routes(&["/a=https://user:pw@x.example/v1", "b.local=http://y:8"]);
        let text = table.describe();
        assert_eq!(text, "host b.local → http://y:8, /a → https://x.example/v1");
        assert!(!text.contains("pw"));
    }
}
