//! `softnic run` options and their validation.
//!
//! Everything a user can get wrong on the command line is rejected here, before any
//! socket is opened, with a message that names the option and the accepted range.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use super::control::{ConnLimits, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_USER};
use super::quota::{Limits, DEFAULT_MAPPED_BYTES, DEFAULT_MRS, DEFAULT_OBJECTS};
use super::udp::Offloads;

/// The path MTUs RoCE defines (IBTA 9.4: IBV_MTU_256 … IBV_MTU_4096).
pub const PATH_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

/// Upper bound of `--delay-us`: 10 s. Delayed packets sit in a bounded queue; a longer
/// delay is a configuration mistake rather than a network to emulate.
pub const MAX_DELAY_US: u64 = 10_000_000;

/// `--addr`: an IP address, and for an IPv6 link-local one the link it is on (its
/// scope, RFC 4007 §11: `fe80::1%eth0`), without which the kernel cannot tell which
/// interface a link-local packet leaves by. Binding with the scope ties the socket to
/// that link (Linux sets the socket's bound device), so peers' link-local addresses,
/// which reach the NIC as GIDs without a scope, are sent to over it
/// (`tests/nic_ipv6_link_local.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NicAddr {
    /// The address (the GID is derived from it).
    pub ip: IpAddr,
    /// Interface index of an IPv6 address's scope; 0 for none.
    pub scope_id: u32,
}

impl NicAddr {
    /// The endpoint to bind: `ip:port`, with the scope for IPv6.
    pub fn socket_addr(&self, port: u16) -> SocketAddr {
        match self.ip {
            IpAddr::V4(v4) => SocketAddr::from((v4, port)),
            IpAddr::V6(v6) => {
                SocketAddr::V6(std::net::SocketAddrV6::new(v6, port, 0, self.scope_id))
            }
        }
    }
}

impl std::str::FromStr for NicAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (ip, scope) = match s.split_once('%') {
            Some((ip, scope)) => (ip, Some(scope)),
            None => (s, None),
        };
        let ip: IpAddr = ip.parse().map_err(|e| format!("{ip}: {e}"))?;
        let scope_id = match scope {
            None if matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local()) => {
                return Err(format!(
                    "{ip} is link-local: name its link, e.g. {ip}%eth0 or {ip}%2"
                ))
            }
            None => 0,
            Some(_) if ip.is_ipv4() => return Err(format!("{s}: IPv4 addresses have no scope")),
            Some(scope) => match scope.parse::<u32>() {
                Ok(index) if index > 0 => index,
                _ => crate::nic::udp::interface_index(scope)
                    .ok_or_else(|| format!("{s}: no network interface {scope:?}"))?,
            },
        };
        Ok(NicAddr { ip, scope_id })
    }
}

impl std::fmt::Display for NicAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.scope_id == 0 {
            write!(f, "{}", self.ip)
        } else {
            write!(f, "{}%{}", self.ip, self.scope_id)
        }
    }
}

/// Arguments of `softnic run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Device name clients open (the control socket is `$SOFTNIC_DIR/NAME.sock`).
    #[arg(long, default_value = "softnic0")]
    pub name: String,
    /// Address to bind and to derive the GID from (IPv4 or IPv6). An IPv6 link-local
    /// address needs its link: `fe80::1%eth0` (or `%IFINDEX`).
    #[arg(long, default_value = "127.0.0.1")]
    pub addr: NicAddr,
    /// UDP port (RoCEv2 is 4791; 0 = any free port, reported in the log and by
    /// QueryDevice — for tests that must not collide with other NICs on the host).
    #[arg(long, default_value_t = wire::ROCEV2_UDP_PORT)]
    pub port: u16,
    /// Largest path MTU this NIC offers (the port's active MTU): 256, 512, 1024, 2048 or
    /// 4096. Default 4096, which fits loopback (MTU 64 KiB); on a 1500-byte Ethernet
    /// link use 1024, as rxe does.
    #[arg(long, default_value_t = 4096)]
    pub mtu: u32,
    /// Turn UDP segmentation offload off: one system call per sent packet. By default
    /// the NIC hands the kernel up to 64 packets (64 KiB) per `sendmsg` (`UDP_SEGMENT`;
    /// segment k carries IPv4 ID k and its ICRC is computed so) where the kernel has it, probed at
    /// start. Injected loss and corruption keep the runs (a lost packet does not join
    /// one); while `--duplicate`, `--reorder` or `--delay-us` is on, packets are sent one
    /// by one anyway, so each RoCE packet is duplicated or held on its own.
    #[arg(long)]
    pub no_gso: bool,
    /// Turn UDP receive coalescing off (`UDP_GRO`, on by default where the kernel has
    /// it): one datagram per receive slot instead of runs from one sender in one buffer.
    #[arg(long)]
    pub no_gro: bool,
    /// Accepted so older command lines keep working: GSO and GRO are on by default.
    #[arg(long, hide = true)]
    pub gso: bool,
    /// Treat a QP's retry_cnt of 7 as "retry forever", as Linux rxe does. Off by
    /// default: IBTA 9.7.6.1.3 and ibv_modify_qp(3) make 7 a plain count (only
    /// rnr_retry 7 means infinite). Useful for soak tests at high loss.
    #[arg(long)]
    pub retry_cnt_7_infinite: bool,
    /// Resend only after each QP's Local ACK Timeout (4.096 µs × 2^timeout, IBTA
    /// 9.7.6.1.3), as Linux rxe does. By default RC QPs resend after an RTT-estimated
    /// timeout (at least 100 µs, at most the Local ACK Timeout); retry_cnt is still
    /// charged once per Local ACK Timeout without progress, so a dead peer is detected
    /// exactly as late as with strict timing (docs/architecture.md).
    #[arg(long)]
    pub strict_ack_timeout: bool,
    /// Never sleep: keep polling (yielding the core when idle) instead of setting
    /// NEED_WAKEUP and blocking in poll(2). Clients then never need the wake pipe,
    /// so a post makes no syscall at all — what the no-syscall test relies on, and what
    /// a latency-bound user who can spare a core wants (io_uring SQPOLL without idle).
    #[arg(long)]
    pub busy_poll: bool,
    /// Record CLOCK_MONOTONIC stamps of every packet sent and received and of each
    /// completion pass, and write them to this file when the NIC stops (nic/trace.rs;
    /// tests/perf/run's round-trip breakdown). Off by default.
    #[arg(long, value_name = "FILE")]
    pub trace_lat: Option<PathBuf>,
    /// Write every packet sent and received to this pcap file (Ethernet/IP/UDP framing).
    #[arg(long)]
    pub pcap: Option<PathBuf>,
    /// Fault injection: probability in [0,1] that a sent packet is dropped.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Fault injection: probability in [0,1] that a sent packet is held back so later
    /// packets overtake it.
    #[arg(long, default_value_t = 0.0)]
    pub reorder: f64,
    /// Fault injection: probability in [0,1] that a sent packet is sent twice.
    #[arg(long, default_value_t = 0.0)]
    pub duplicate: f64,
    /// Fault injection: probability in [0,1] that one bit of a sent packet is flipped
    /// after its ICRC was computed (the receiver's ICRC check must catch it).
    #[arg(long, default_value_t = 0.0)]
    pub corrupt: f64,
    /// Fault injection: delay every sent packet by this many microseconds.
    #[arg(long, default_value_t = 0)]
    pub delay_us: u64,
    /// Seed of the fault injector's random generator (same seed, same decisions).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Fault injection: drop the Nth CM MAD of type MSG this NIC sends (MSG: REQ, MRA,
    /// REJ, REP, RTU, DREQ, DREP; N from 1), e.g. `REP:1`, to see the peer's CM retry.
    #[arg(long, value_name = "MSG:N")]
    pub drop_cm: Option<String>,
    /// Most control connections open at once (each holds a thread); more are refused.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: u32,
    /// Most control connections one user (peer uid) may hold open at once.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS_PER_USER)]
    pub max_connections_per_user: u32,
    /// Most protection domains one user may hold, over all its connections.
    #[arg(long, default_value_t = DEFAULT_OBJECTS)]
    pub max_pds_per_user: u32,
    /// Most completion queues one user may hold, over all its connections.
    #[arg(long, default_value_t = DEFAULT_OBJECTS)]
    pub max_cqs_per_user: u32,
    /// Most queue pairs one user may hold, over all its connections.
    #[arg(long, default_value_t = DEFAULT_OBJECTS)]
    pub max_qps_per_user: u32,
    /// Most memory regions one user may hold, over all its connections.
    #[arg(long, default_value_t = DEFAULT_MRS)]
    pub max_mrs_per_user: u32,
    /// Most RDMA CM ids one user may hold, over all its connections (each may hold a
    /// port; those the NIC makes for incoming connection requests are bounded by the
    /// listeners' backlogs instead).
    #[arg(long, default_value_t = DEFAULT_OBJECTS)]
    pub max_cm_ids_per_user: u32,
    /// Most bytes of client memory the NIC maps for one user (memory regions and ring
    /// segments, over all its connections). Default 1 TiB (2^40).
    #[arg(long, default_value_t = DEFAULT_MAPPED_BYTES)]
    pub max_mapped_bytes_per_user: u64,
}

/// Fault-injection settings, validated.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    /// P(drop).
    pub loss: f64,
    /// P(hold back to be overtaken).
    pub reorder: f64,
    /// P(send twice).
    pub duplicate: f64,
    /// P(flip one bit).
    pub corrupt: f64,
    /// Added to every packet.
    pub delay: Duration,
    /// PRNG seed.
    pub seed: u64,
    /// `--drop-cm`: the one CM MAD to drop.
    pub drop_cm: Option<DropCm>,
}

/// `--drop-cm MSG:N`: drop the `nth` sent CM MAD whose attribute ID is `attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropCm {
    /// CM attribute ID (IBTA 12.6, table 98), e.g. 0x0010 for REQ.
    pub attr: u16,
    /// Which one of them, from 1.
    pub nth: u32,
}

impl std::str::FromStr for DropCm {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<DropCm, ConfigError> {
        use wire::cm::attr;
        let bad = || {
            ConfigError(format!(
                "--drop-cm {s}: expected MSG:N, MSG one of REQ MRA REJ REP RTU DREQ DREP, N ≥ 1"
            ))
        };
        let (msg, n) = s.split_once(':').ok_or_else(bad)?;
        let attr = match msg.to_ascii_uppercase().as_str() {
            "REQ" => attr::REQ,
            "MRA" => attr::MRA,
            "REJ" => attr::REJ,
            "REP" => attr::REP,
            "RTU" => attr::RTU,
            "DREQ" => attr::DREQ,
            "DREP" => attr::DREP,
            _ => return Err(bad()),
        };
        match n.parse::<u32>() {
            Ok(nth) if nth >= 1 => Ok(DropCm { attr, nth }),
            _ => Err(bad()),
        }
    }
}

impl FaultConfig {
    /// True when no fault is configured: packets go straight to the socket.
    pub fn is_none(&self) -> bool {
        self.loss == 0.0
            && self.reorder == 0.0
            && self.duplicate == 0.0
            && self.corrupt == 0.0
            && self.delay.is_zero()
            && self.drop_cm.is_none()
    }

    /// True when every configured fault can be decided packet by packet as packets join
    /// a GSO run: loss, corruption and `--drop-cm` only (no packet is doubled or held).
    pub fn fits_runs(&self) -> bool {
        self.duplicate == 0.0 && self.reorder == 0.0 && self.delay.is_zero()
    }
}

/// A validated NIC configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Device name.
    pub name: String,
    /// UDP endpoint the NIC binds.
    pub bind: SocketAddr,
    /// Largest path MTU offered.
    pub mtu: u32,
    /// UDP offloads asked for (each used only if the kernel has it).
    pub offloads: Offloads,
    /// rxe's retry_cnt 7 = infinite.
    pub retry_cnt_7_infinite: bool,
    /// Resend only after the Local ACK Timeout.
    pub strict_ack_timeout: bool,
    /// Never sleep (no NEED_WAKEUP, no poll(2)).
    pub busy_poll: bool,
    /// Latency trace file.
    pub trace_lat: Option<PathBuf>,
    /// Capture file.
    pub pcap: Option<PathBuf>,
    /// Fault injection.
    pub fault: FaultConfig,
    /// Directory of the control socket (`$SOFTNIC_DIR`, default `/tmp/softnic`).
    pub dir: PathBuf,
    /// Bounds on control connections.
    pub connections: ConnLimits,
    /// Per-user object and mapping quotas.
    pub quotas: Limits,
}

/// A rejected option.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Checks a device name: it becomes a file name, so only `[A-Za-z0-9_.-]`, 1–64 bytes,
/// not starting with a dot.
pub fn check_name(name: &str) -> Result<(), ConfigError> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if name.is_empty() || name.len() > 64 || !ok_chars || name.starts_with('.') {
        return Err(ConfigError(format!(
            "--name {name:?}: a device name is 1-64 characters of A-Z a-z 0-9 _ . - and does not start with '.'"
        )));
    }
    Ok(())
}

fn check_probability(opt: &str, p: f64) -> Result<f64, ConfigError> {
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(ConfigError(format!(
            "--{opt} {p}: a probability must be between 0 and 1"
        )))
    }
}

impl Config {
    /// Validates `a`; `dir` is the control-socket directory.
    pub fn from_args(a: &RunArgs, dir: PathBuf) -> Result<Config, ConfigError> {
        check_name(&a.name)?;
        if !PATH_MTUS.contains(&a.mtu) {
            return Err(ConfigError(format!(
                "--mtu {}: must be one of 256, 512, 1024, 2048, 4096",
                a.mtu
            )));
        }
        if a.addr.ip.is_unspecified() || a.addr.ip.is_multicast() {
            return Err(ConfigError(format!(
                "--addr {}: must be a unicast address of this host (it becomes the GID)",
                a.addr
            )));
        }
        if a.delay_us > MAX_DELAY_US {
            return Err(ConfigError(format!(
                "--delay-us {}: at most {MAX_DELAY_US}",
                a.delay_us
            )));
        }
        for (opt, v) in [
            ("max-connections", u64::from(a.max_connections)),
            (
                "max-connections-per-user",
                u64::from(a.max_connections_per_user),
            ),
            ("max-pds-per-user", u64::from(a.max_pds_per_user)),
            ("max-cqs-per-user", u64::from(a.max_cqs_per_user)),
            ("max-qps-per-user", u64::from(a.max_qps_per_user)),
            ("max-mrs-per-user", u64::from(a.max_mrs_per_user)),
            ("max-cm-ids-per-user", u64::from(a.max_cm_ids_per_user)),
            ("max-mapped-bytes-per-user", a.max_mapped_bytes_per_user),
        ] {
            if v == 0 {
                return Err(ConfigError(format!(
                    "--{opt} 0: must be at least 1 (a NIC nobody can use)"
                )));
            }
        }
        let fault = FaultConfig {
            loss: check_probability("loss", a.loss)?,
            reorder: check_probability("reorder", a.reorder)?,
            duplicate: check_probability("duplicate", a.duplicate)?,
            corrupt: check_probability("corrupt", a.corrupt)?,
            delay: Duration::from_micros(a.delay_us),
            seed: a.seed,
            drop_cm: a.drop_cm.as_deref().map(str::parse).transpose()?,
        };
        Ok(Config {
            name: a.name.clone(),
            bind: a.addr.socket_addr(a.port),
            mtu: a.mtu,
            offloads: Offloads {
                gso: !a.no_gso,
                gro: !a.no_gro,
            },
            retry_cnt_7_infinite: a.retry_cnt_7_infinite,
            strict_ack_timeout: a.strict_ack_timeout,
            busy_poll: a.busy_poll,
            trace_lat: a.trace_lat.clone(),
            pcap: a.pcap.clone(),
            fault,
            dir,
            connections: ConnLimits {
                total: a.max_connections,
                per_user: a.max_connections_per_user,
            },
            quotas: Limits {
                pds: a.max_pds_per_user,
                cqs: a.max_cqs_per_user,
                qps: a.max_qps_per_user,
                mrs: a.max_mrs_per_user,
                cm_ids: a.max_cm_ids_per_user,
                mapped_bytes: a.max_mapped_bytes_per_user,
            },
        })
    }

    /// Path of the control socket.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join(format!("{}.sock", self.name))
    }
}

impl Default for RunArgs {
    fn default() -> Self {
        RunArgs {
            name: "softnic0".into(),
            addr: NicAddr {
                ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
                scope_id: 0,
            },
            port: wire::ROCEV2_UDP_PORT,
            mtu: 4096,
            no_gso: false,
            no_gro: false,
            gso: false,
            retry_cnt_7_infinite: false,
            strict_ack_timeout: false,
            busy_poll: false,
            trace_lat: None,
            pcap: None,
            loss: 0.0,
            reorder: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            delay_us: 0,
            seed: 1,
            drop_cm: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_user: DEFAULT_MAX_CONNECTIONS_PER_USER,
            max_pds_per_user: DEFAULT_OBJECTS,
            max_cqs_per_user: DEFAULT_OBJECTS,
            max_qps_per_user: DEFAULT_OBJECTS,
            max_mrs_per_user: DEFAULT_MRS,
            max_cm_ids_per_user: DEFAULT_OBJECTS,
            max_mapped_bytes_per_user: DEFAULT_MAPPED_BYTES,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(a: RunArgs) -> Result<Config, ConfigError> {
        Config::from_args(&a, PathBuf::from("/tmp/x"))
    }

    #[test]
    fn defaults_are_valid() {
        let c = cfg(RunArgs::default()).unwrap();
        assert_eq!(c.bind, "127.0.0.1:4791".parse().unwrap());
        assert_eq!(c.mtu, 4096);
        assert!(c.fault.is_none());
        assert!(!c.busy_poll, "the NIC sleeps when idle unless asked not to");
        assert_eq!(
            c.offloads,
            Offloads {
                gso: true,
                gro: true
            },
            "UDP offloads are asked for by default"
        );
        assert_eq!(c.connections, ConnLimits::default());
        assert_eq!(c.quotas, Limits::default());
        assert_eq!(c.socket_path(), PathBuf::from("/tmp/x/softnic0.sock"));
    }

    #[test]
    fn rejects_probabilities_outside_unit_interval() {
        for (p, ok) in [
            (0.0, true),
            (1.0, true),
            (0.2, true),
            (-0.1, false),
            (1.5, false),
        ] {
            let r = cfg(RunArgs {
                loss: p,
                ..RunArgs::default()
            });
            assert_eq!(r.is_ok(), ok, "loss {p}");
        }
        let e = cfg(RunArgs {
            corrupt: f64::NAN,
            ..RunArgs::default()
        })
        .unwrap_err();
        assert!(e.0.contains("--corrupt"), "{e}");
    }

    #[test]
    fn rejects_bad_mtu_name_and_delay() {
        assert!(cfg(RunArgs {
            mtu: 1500,
            ..RunArgs::default()
        })
        .unwrap_err()
        .0
        .contains("--mtu"));
        for bad in ["", "../x", ".hidden", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("softnic-1.b_c").is_ok());
        assert!(cfg(RunArgs {
            delay_us: MAX_DELAY_US + 1,
            ..RunArgs::default()
        })
        .is_err());
    }

    #[test]
    fn limits_must_be_positive() {
        let e = cfg(RunArgs {
            max_mrs_per_user: 0,
            ..RunArgs::default()
        })
        .unwrap_err();
        assert!(e.0.contains("--max-mrs-per-user"), "{e}");
        let c = cfg(RunArgs {
            max_connections_per_user: 3,
            max_mapped_bytes_per_user: 1 << 20,
            ..RunArgs::default()
        })
        .unwrap();
        assert_eq!(c.connections.per_user, 3);
        assert_eq!(c.quotas.mapped_bytes, 1 << 20);
    }

    #[test]
    fn no_gso_and_no_gro_turn_each_offload_off() {
        let c = cfg(RunArgs {
            no_gso: true,
            ..RunArgs::default()
        })
        .unwrap();
        assert_eq!(
            c.offloads,
            Offloads {
                gso: false,
                gro: true
            }
        );
        let c = cfg(RunArgs {
            no_gro: true,
            ..RunArgs::default()
        })
        .unwrap();
        assert_eq!(
            c.offloads,
            Offloads {
                gso: true,
                gro: false
            }
        );
    }

    #[test]
    fn accepts_ipv6() {
        let c = cfg(RunArgs {
            addr: "::1".parse().unwrap(),
            ..RunArgs::default()
        })
        .unwrap();
        assert_eq!(c.bind, "[::1]:4791".parse().unwrap());
    }

    #[test]
    fn link_local_ipv6_needs_and_keeps_its_scope() {
        let a: NicAddr = "fe80::1%1".parse().unwrap();
        assert_eq!((a.ip, a.scope_id), ("fe80::1".parse().unwrap(), 1));
        assert_eq!(a.socket_addr(4791).to_string(), "[fe80::1%1]:4791");
        // `lo` is interface 1 in every network namespace.
        assert_eq!("fe80::1%lo".parse::<NicAddr>().unwrap().scope_id, 1);
        assert!("fe80::1"
            .parse::<NicAddr>()
            .unwrap_err()
            .contains("link-local"));
        assert!("fe80::1%no-such-if0".parse::<NicAddr>().is_err());
        assert!("127.0.0.1%1".parse::<NicAddr>().is_err());
        assert_eq!("::1".parse::<NicAddr>().unwrap().scope_id, 0);
    }
}
