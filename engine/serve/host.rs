//! DNS-rebinding protection: a request is answered only when its `Host` names this monitor.
//!
//! A page on another site can make its name resolve to 127.0.0.1 (DNS rebinding) and then
//! talk to the monitor as if it were that site; the browser still sends the attacker's name
//! in `Host`. The token already keeps such a page out (the monitor's cookie belongs to its
//! own name, and the page does not know the token), so this check is a second wall, in front
//! of the token's.
//!
//! Accepted names: without `--allow-remote`, only loopback (`localhost`, `127.0.0.0/8`,
//! `[::1]`). With it, the addresses the monitor listens on (every IP address when it listens
//! on all of them: `0.0.0.0`, `::`), and `localhost` when it listens on loopback too. In both,
//! the name given to `--addr` and the names given with `--allow-host`: the user named them,
//! and a rebinding page cannot make the browser send a name it does not control. A request
//! that addresses an IP address directly is never rebinding (rebinding needs a name), so
//! accepting every IP address on `0.0.0.0` gives nothing away and spares listing the
//! machine's interfaces. The port must be the monitor's, or absent.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Monitor;

/// The `Host` values the monitor answers to.
#[derive(Clone, Debug)]
pub(crate) struct Hosts {
    /// Whether `--allow-remote` was given.
    pub(crate) remote: bool,
    /// The addresses listened on.
    pub(crate) bound: Vec<IpAddr>,
    /// The port listened on (every address shares it).
    pub(crate) port: u16,
    /// Names accepted besides loopback's: `--addr`'s and `--allow-host`'s, in lower case
    /// without a trailing dot.
    pub(crate) names: Vec<String>,
}

/// A `Host` value's parts.
#[derive(Debug, PartialEq, Eq)]
enum Authority {
    Ip(IpAddr),
    Name(String),
}

/// Splits `NAME[:PORT]`, `IPV4[:PORT]` or `[IPV6][:PORT]`; `None` for anything else.
fn parse(value: &str) -> Option<(Authority, Option<u16>)> {
    let port = |p: &str| p.parse::<u16>().ok();
    if let Some(rest) = value.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        let ip: std::net::Ipv6Addr = ip.parse().ok()?;
        let port = match after {
            "" => None,
            p => Some(port(p.strip_prefix(':')?)?),
        };
        return Some((Authority::Ip(IpAddr::V6(ip)), port));
    }
    let (name, port) = match value.rsplit_once(':') {
        Some((name, p)) => (name, Some(port(p)?)),
        None => (value, None),
    };
    if name.is_empty() || name.contains(':') {
        return None;
    }
    if let Ok(ip) = name.parse::<std::net::Ipv4Addr>() {
        return Some((Authority::Ip(IpAddr::V4(ip)), port));
    }
    Some((Authority::Name(normal_name(name)), port))
}

/// Whether `c` may be in a host name given with `--allow-host`.
pub(crate) fn name_character(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')
}

/// A host name as compared: lower case, without the trailing dot of a fully qualified one.
pub(crate) fn normal_name(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

impl Hosts {
    /// Whether the monitor answers to a request for `value` (a `Host` header).
    pub(crate) fn allows(&self, value: &str) -> bool {
        let Some((authority, port)) = parse(value) else {
            return false;
        };
        if port.is_some_and(|p| p != self.port) {
            return false;
        }
        match authority {
            Authority::Ip(ip) => self.allows_ip(ip) || self.names.contains(&ip.to_string()),
            Authority::Name(name) => {
                (name == "localhost" && self.serves_loopback()) || self.names.contains(&name)
            }
        }
    }

    fn allows_ip(&self, ip: IpAddr) -> bool {
        if !self.remote {
            return ip.is_loopback();
        }
        self.bound
            .iter()
            .any(|b| b.is_unspecified() || *b == ip || (b.is_loopback() && ip.is_loopback()))
    }

    fn serves_loopback(&self) -> bool {
        !self.remote
            || self
                .bound
                .iter()
                .any(|b| b.is_loopback() || b.is_unspecified())
    }

    /// An address to open instead, for the refusal's message.
    fn example(&self) -> String {
        match self.bound.first() {
            Some(ip) if !ip.is_unspecified() && ip.is_ipv6() => format!("[{ip}]:{}", self.port),
            Some(ip) if !ip.is_unspecified() => format!("{ip}:{}", self.port),
            _ => format!("127.0.0.1:{}", self.port),
        }
    }
}

/// The middleware in front of every route, the token's included.
pub(crate) async fn guard(
    State(monitor): State<Arc<Monitor>>,
    req: Request,
    next: Next,
) -> Response {
    let hosts = &monitor.hosts;
    // A request without `Host` comes from no browser (every browser sends it), so it cannot
    // be a rebinding page's; the token still applies. A request line with an authority
    // (`GET http://NAME/`) is checked as its `Host` would be.
    let given = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .into_iter()
        .chain(
            req.headers()
                .get_all(header::HOST)
                .iter()
                .map(|v| v.to_str().unwrap_or("\u{fffd}").to_string()),
        )
        .find(|h| !hosts.allows(h));
    let Some(refused) = given else {
        return next.run(req).await;
    };
    // The name is echoed as plain text (and `nosniff`), cut short and printable only.
    let shown: String = refused
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(100)
        .collect();
    // The name without its port (`[v6]` kept whole).
    let name = match shown.rsplit_once(':') {
        Some((name, _)) if !shown.ends_with(']') => name,
        _ => shown.as_str(),
    };
    let text = format!(
        "refused: this ralph-flow monitor does not answer to the host `{shown}` (a protection against DNS rebinding). Open it at http://{}/ as `ralph-flow serve` printed, or, if `{name}` names this machine, start it with `--allow-host {name}`\n",
        hosts.example(),
    );
    let mut resp = (
        StatusCode::MISDIRECTED_REQUEST,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response();
    resp.headers_mut().insert(
        header::HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(remote: bool, bound: &[&str], names: &[&str]) -> Hosts {
        Hosts {
            remote,
            bound: bound
                .iter()
                .map(|b| b.parse().unwrap_or_else(|e| panic!("{b}: {e}")))
                .collect(),
            port: 7700,
            names: names.iter().map(|n| normal_name(n)).collect(),
        }
    }

    #[test]
    fn loopback_answers_to_loopback_names_on_its_port_only() {
        let h = hosts(false, &["127.0.0.1"], &[]);
        for ok in [
            "127.0.0.1:7700",
            "127.0.0.1",
            "localhost:7700",
            "LOCALHOST",
            "localhost.:7700",
            "[::1]:7700",
            "[::1]",
            "127.0.0.2:7700",
        ] {
            assert!(h.allows(ok), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:7700",
            "localhost:7701",
            "127.0.0.1:80",
            "10.0.0.1:7700",
            "localhost.evil.example:7700",
            "::1",
            "[::1",
            "[::1]7700",
            "localhost:",
            "localhost:port",
            "",
        ] {
            assert!(!h.allows(refused), "{refused}");
        }
    }

    #[test]
    fn remote_answers_to_its_addresses_and_the_names_given() {
        let all = hosts(true, &["0.0.0.0"], &["monitor.lan"]);
        for ok in [
            "10.1.2.3:7700",
            "127.0.0.1:7700",
            "localhost:7700",
            "Monitor.LAN:7700",
            "monitor.lan",
        ] {
            assert!(all.allows(ok), "{ok}");
        }
        assert!(!all.allows("evil.example:7700"));
        assert!(!all.allows("monitor.lan:7701"));
        let one = hosts(true, &["10.1.2.3"], &[]);
        assert!(one.allows("10.1.2.3:7700"));
        assert!(!one.allows("10.1.2.4:7700"));
        assert!(!one.allows("localhost:7700"), "not listening on loopback");
        // Names given are accepted on loopback too: the user vouches for them.
        let named = hosts(false, &["127.0.0.1"], &["dev.localhost"]);
        assert!(named.allows("dev.localhost:7700"));
        assert!(!named.allows("other.localhost:7700"));
    }
}
