//! A TCP proxy in front of a member's peer port, which a test can cut: its connections are
//! closed and new ones refused until it is healed. Two members that reach each other only
//! through their proxies are partitioned by cutting both, while clients and the witness still
//! reach each of them (no root, no firewall needed).

use std::sync::Arc;

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; it stops when dropped.
#[derive(Debug)]
pub struct Proxy {
    cut: Arc<watch::Sender<bool>>,
    _runtime: tokio::runtime::Runtime,
}

impl Proxy {
    /// Listens on 127.0.0.1:`listen` and forwards each connection to 127.0.0.1:`target`.
    pub fn start(listen: u16, target: u16) -> Proxy {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the proxy");
        let cut = Arc::new(watch::channel(false).0);
        let listener = runtime
            .block_on(TcpListener::bind(("127.0.0.1", listen)))
            .expect("bind the proxy's port");
        let accepting = cut.clone();
        runtime.spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    // (a connection reset before it was accepted, say: keep listening)
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                let mut cut = accepting.subscribe();
                if *cut.borrow() {
                    continue; // dropped: refused
                }
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    let mut inbound = inbound;
                    tokio::select! {
                        _ = copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.wait_for(|&c| c) => {}
                    }
                });
            }
        });
        Proxy {
            cut,
            _runtime: runtime,
        }
    }

    /// Cuts (closes every connection, refuses new ones) or heals the link.
    pub fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}
