//! Listening addresses as users write them, and the sockets behind them.
//!
//! - `:8443` (the default; also `*:8443`): every address. One IPv6 socket with IPV6_V6ONLY off,
//!   so IPv4 clients reach it too (as `::ffff:10.0.0.1`); where the kernel has no IPv6 at all,
//!   plain `0.0.0.0:8443`. Works the same in IPv4-only, IPv6-only and dual-stack clusters.
//! - `0.0.0.0:8443`, `10.0.0.5:8443`, `[::1]:8443`: that address only (`[::]` is dual-stack as
//!   above, without the IPv4 fallback).
//! - `localhost:8443`, `webhook.example:8443`: every address the name resolves to, all on one
//!   port (with port 0, the port the first one got).

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};

/// A `--addr` / `--health-addr` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    /// Every address, IPv6 and IPv4, on this port.
    Any(u16),
    /// One address.
    Ip(SocketAddr),
    /// Every address a host name resolves to.
    Host(String, u16),
}

/// Why a listening address was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ListenAddrError {
    #[error("{0:?} has no port: write HOST:PORT, [IPv6]:PORT or :PORT (every address)")]
    NoPort(String),
    #[error("{0:?}: the port is not a number from 0 to 65535")]
    BadPort(String),
    #[error("{0:?}: an IPv6 address goes in brackets, as [::1]:8443")]
    UnbracketedIpv6(String),
    #[error("{0:?} is not an IP address or a host name")]
    BadHost(String),
}

impl FromStr for ListenAddr {
    type Err = ListenAddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(addr) = s.parse::<SocketAddr>() {
            return Ok(ListenAddr::Ip(addr));
        }
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| ListenAddrError::NoPort(s.to_owned()))?;
        if host.contains(':') {
            return Err(if host.starts_with('[') {
                ListenAddrError::BadHost(s.to_owned())
            } else {
                ListenAddrError::UnbracketedIpv6(s.to_owned())
            });
        }
        let port = port
            .parse::<u16>()
            .map_err(|_| ListenAddrError::BadPort(s.to_owned()))?;
        match host {
            "" | "*" => Ok(ListenAddr::Any(port)),
            h if is_host_name(h) => Ok(ListenAddr::Host(h.to_ascii_lowercase(), port)),
            _ => Err(ListenAddrError::BadHost(s.to_owned())),
        }
    }
}

/// RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens.
fn is_host_name(h: &str) -> bool {
    h.len() <= 253
        && h.trim_end_matches('.').split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Any(port) => write!(f, ":{port}"),
            ListenAddr::Ip(addr) => write!(f, "{addr}"),
            ListenAddr::Host(host, port) => write!(f, "{host}:{port}"),
        }
    }
}

/// One or more bound sockets served as one.
#[derive(Debug)]
pub struct Listeners {
    sockets: Vec<TcpListener>,
    /// Where the next accept starts looking, so that a busy socket cannot starve another.
    next: AtomicUsize,
}

impl Listeners {
    /// Binds every socket `addr` stands for.
    pub async fn bind(addr: &ListenAddr) -> io::Result<Listeners> {
        let sockets = match addr {
            ListenAddr::Any(port) => vec![bind_any(*port)?],
            ListenAddr::Ip(addr) => vec![bind_one(*addr)?],
            ListenAddr::Host(host, port) => bind_host(host, *port).await?,
        };
        Ok(Listeners {
            sockets,
            next: AtomicUsize::new(0),
        })
    }

    /// The bound addresses, in binding order.
    pub fn local_addrs(&self) -> io::Result<Vec<SocketAddr>> {
        self.sockets.iter().map(TcpListener::local_addr).collect()
    }

    /// The first bound address (the only one unless a host name resolved to several).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sockets[0].local_addr()
    }

    /// The next connection on any of the sockets.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let n = self.sockets.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        std::future::poll_fn(|cx| {
            for i in 0..n {
                if let Poll::Ready(result) = self.sockets[(start + i) % n].poll_accept(cx) {
                    return Poll::Ready(result);
                }
            }
            Poll::Pending
        })
        .await
    }
}

impl axum::serve::Listener for Listeners {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            match Listeners::accept(self).await {
                Ok(accepted) => return accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Listeners::local_addr(self)
    }
}

/// `[::]` with IPv4 mapped in; `0.0.0.0` where IPv6 is missing.
fn bind_any(port: u16) -> io::Result<TcpListener> {
    let v6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
    match bind_one(v6) {
        Ok(listener) => Ok(listener),
        Err(error) if !ipv6_may_be_missing(&error) => Err(error),
        Err(error) => {
            tracing::info!(%error, "no IPv6 here; listening on IPv4 only");
            bind_one(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
        }
    }
}

/// A port in use or a privileged port is the same problem on IPv4: report it, do not fall back.
fn ipv6_may_be_missing(error: &io::Error) -> bool {
    !matches!(
        error.kind(),
        io::ErrorKind::AddrInUse | io::ErrorKind::PermissionDenied
    )
}

fn bind_one(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        // `[::]` serves IPv4 too, whatever net.ipv6.bindv6only says.
        socket.set_only_v6(!addr.ip().is_unspecified())?;
    }
    // As tokio's own bind does: a restarted server rebinds while old connections linger.
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

async fn bind_host(host: &str, port: u16) -> io::Result<Vec<TcpListener>> {
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for addr in tokio::net::lookup_host((host, port)).await? {
        if !addrs.contains(&addr) {
            addrs.push(addr);
        }
    }
    let mut sockets: Vec<TcpListener> = Vec::new();
    let mut errors = Vec::new();
    for mut addr in addrs {
        if let Some(first) = sockets.first() {
            addr.set_port(first.local_addr()?.port());
        }
        match bind_one(addr) {
            Ok(listener) => sockets.push(listener),
            // `localhost` may name ::1 on a host without IPv6: serve the addresses that exist.
            Err(error) if error.kind() == io::ErrorKind::AddrNotAvailable => {
                tracing::warn!(%error, %addr, host, "skipping an address of the host name");
                errors.push(format!("{addr}: {error}"));
            }
            Err(error) => {
                return Err(io::Error::new(error.kind(), format!("{addr}: {error}")));
            }
        }
    }
    if sockets.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            format!(
                "{host} resolves to no address this host can listen on ({})",
                if errors.is_empty() {
                    "no addresses".to_owned()
                } else {
                    errors.join("; ")
                }
            ),
        ));
    }
    Ok(sockets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_users_write() {
        let cases = [
            (":8443", ListenAddr::Any(8443)),
            ("*:8081", ListenAddr::Any(8081)),
            (
                "0.0.0.0:8443",
                ListenAddr::Ip("0.0.0.0:8443".parse().unwrap()),
            ),
            ("[::]:8443", ListenAddr::Ip("[::]:8443".parse().unwrap())),
            ("[::1]:0", ListenAddr::Ip("[::1]:0".parse().unwrap())),
            ("localhost:8443", ListenAddr::Host("localhost".into(), 8443)),
            (
                "Webhook.Example.:443",
                ListenAddr::Host("webhook.example.".into(), 443),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<ListenAddr>(), Ok(want.clone()), "{text}");
            if !text.starts_with('*') && !text.contains('W') {
                assert_eq!(want.to_string(), text);
            }
        }
    }

    #[test]
    fn refuses_with_the_fix_in_the_message() {
        let cases = [
            ("8443", "has no port"),
            ("localhost", "has no port"),
            (":http", "not a number"),
            (":70000", "not a number"),
            ("::1:8443", "goes in brackets"),
            ("[::1:8443", "not an IP address or a host name"),
            ("my_host:8443", "not an IP address or a host name"),
            ("-bad.example:8443", "not an IP address or a host name"),
        ];
        for (text, want) in cases {
            let err = text.parse::<ListenAddr>().unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn only_a_busy_or_privileged_port_stops_the_ipv4_fallback() {
        for kind in [io::ErrorKind::AddrInUse, io::ErrorKind::PermissionDenied] {
            assert!(!ipv6_may_be_missing(&io::Error::from(kind)));
        }
        // EAFNOSUPPORT (no IPv6 in the kernel) and EADDRNOTAVAIL.
        assert!(ipv6_may_be_missing(&io::Error::from_raw_os_error(97)));
        assert!(ipv6_may_be_missing(&io::Error::from(
            io::ErrorKind::AddrNotAvailable
        )));
    }

    #[tokio::test]
    async fn every_address_serves_ipv4_and_ipv6_clients() {
        let listeners = Listeners::bind(&ListenAddr::Any(0)).await.unwrap();
        let port = listeners.local_addr().unwrap().port();
        for client in ["127.0.0.1", "::1"] {
            let ip: std::net::IpAddr = client.parse().unwrap();
            let connect = TcpStream::connect((ip, port));
            let (connected, accepted) = tokio::join!(connect, listeners.accept());
            connected.unwrap_or_else(|e| panic!("{client}: {e}"));
            let (_, peer) = accepted.unwrap();
            // IPv4 clients arrive mapped into IPv6 on the dual-stack socket.
            assert_eq!(peer.ip().to_canonical(), ip, "{client}");
        }
    }

    #[tokio::test]
    async fn a_host_name_binds_each_address_on_one_port() {
        let listeners = Listeners::bind(&ListenAddr::Host("localhost".into(), 0))
            .await
            .unwrap();
        let addrs = listeners.local_addrs().unwrap();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
        assert!(
            addrs.iter().all(|a| a.port() == addrs[0].port()),
            "{addrs:?}"
        );
        for addr in &addrs {
            let (connected, accepted) = tokio::join!(TcpStream::connect(addr), listeners.accept());
            connected.unwrap();
            accepted.unwrap();
        }
    }

    #[tokio::test]
    async fn a_port_in_use_is_an_error_not_a_fallback() {
        let first = Listeners::bind(&ListenAddr::Any(0)).await.unwrap();
        let port = first.local_addr().unwrap().port();
        let err = Listeners::bind(&ListenAddr::Any(port)).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }
}
