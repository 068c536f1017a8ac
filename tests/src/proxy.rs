//! A TCP proxy in front of a member's peer port (or any TCP service), which a test can cut:
//! its connections are closed and new ones refused until it is healed. Two members that reach
//! each other only through their proxies are partitioned by cutting both, while clients and
//! the witness still reach each of them (no root, no firewall needed). A test can also reset
//! it: close every connection once and go on accepting new ones. A proxy can also delay
//! every byte by a fixed time each way, like a WAN link (without limiting its bandwidth).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, copy_bidirectional};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// A running proxy; it stops when dropped.
#[derive(Debug)]
pub struct Proxy {
    cut: Arc<watch::Sender<bool>>,
    /// Bumped by [`Proxy::reset`]: each connection ends when it changes.
    resets: Arc<watch::Sender<u64>>,
    _runtime: tokio::runtime::Runtime,
}

impl Proxy {
    /// Listens on `listen` and forwards each connection to `target`, every byte `delay` late
    /// in each direction.
    pub fn between(listen: SocketAddr, target: SocketAddr, delay: Duration) -> Proxy {
        let listener = std::net::TcpListener::bind(listen).expect("bind the proxy's port");
        Self::on(listener, target, delay)
    }

    /// As [`Proxy::between`] on a listener already bound (in another network namespace, say:
    /// a socket stays in the namespace it was made in).
    pub fn on(listener: std::net::TcpListener, target: SocketAddr, delay: Duration) -> Proxy {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the proxy");
        let cut = Arc::new(watch::channel(false).0);
        let resets = Arc::new(watch::channel(0u64).0);
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener).expect("the proxy's listener")
        };
        let accepting = cut.clone();
        let resetting = resets.clone();
        runtime.spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    // (a connection reset before it was accepted, say: keep listening)
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let mut cut = accepting.subscribe();
                if *cut.borrow() {
                    continue; // dropped: refused
                }
                let mut reset = resetting.subscribe();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    tokio::select! {
                        _ = relay(inbound, outbound, delay) => {}
                        _ = cut.wait_for(|&c| c) => {}
                        _ = reset.changed() => {}
                    }
                });
            }
        });
        Proxy {
            cut,
            resets,
            _runtime: runtime,
        }
    }

    /// Closes every connection through the proxy once; new ones are accepted as before (a
    /// middlebox that dropped its connections, not a partition).
    pub fn reset(&self) {
        self.resets.send_modify(|n| *n += 1);
    }

    /// Cuts (closes every connection, refuses new ones) or heals the link.
    pub fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

/// Copies both ways until either side closes.
async fn relay(mut a: TcpStream, mut b: TcpStream, delay: Duration) {
    if delay.is_zero() {
        let _ = copy_bidirectional(&mut a, &mut b).await;
        return;
    }
    let (ar, aw) = a.into_split();
    let (br, bw) = b.into_split();
    tokio::select! {
        () = delayed(ar, bw, delay) => {}
        () = delayed(br, aw, delay) => {}
    }
}

/// Copies `from` to `to`, each piece written `delay` after it was read, in order.
async fn delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0
                || tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((due, piece)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&piece).await.is_err() {
                break;
            }
        }
    };
    // (the writer drains what was read before the reader's side closed)
    let _ = tokio::join!(reader, writer);
}
