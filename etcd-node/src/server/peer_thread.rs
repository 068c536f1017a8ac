//! The thread the member's Raft traffic runs on: a single-threaded async runtime of its own
//! for the peer links ([`super::peer::Peers`]), the peer listeners' server and the witness
//! steps. The client API runs on the process's runtime, apart.
//!
//! Why apart: a client request is served on a runtime worker from start to end, and some take
//! long (a range over a large key space, a watch catching up). On a runtime shared with the
//! peers, such a request held back the heartbeats, appends and acknowledgements queued behind
//! it on that worker, and a long enough one cost an election. Here nothing but Raft's own
//! traffic waits for Raft's traffic. The price is a thread that sleeps between messages where
//! the shared workers were often awake: no CPU per put at 16 clients, about 10% at 64
//! (docs/benchmarks.md, "Threads").
//!
//! Invariant: the runtime lives exactly as long as its [`PeerThread`]: dropping it stops the
//! runtime (before `drop` returns) without waiting for its tasks (a witness step blocked on a
//! hung share must not hold the member's stop), and a task spawned after that is dropped unrun.

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The peer runtime's thread; the runtime stops when this is dropped.
#[derive(Debug)]
pub struct PeerThread {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeerThread {
    /// Starts the thread (named `peer`; its blocking pool's threads `peer-blocking`) and its
    /// runtime.
    pub fn start() -> std::io::Result<PeerThread> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("peer-blocking")
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("peer".into())
            .spawn(move || {
                // (a dropped sender ends the wait too)
                let _ = runtime.block_on(stopped);
                runtime.shutdown_background();
            })?;
        Ok(PeerThread {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where the Raft traffic's tasks are spawned.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for PeerThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // (quick: the thread only stops the runtime, waiting for none of its tasks)
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn tasks_run_on_the_peer_thread_until_it_is_dropped() {
        let peer = PeerThread::start().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let tx2 = tx.clone();
        peer.handle().spawn(async move {
            let name = std::thread::current().name().map(str::to_string);
            tx2.send(name).unwrap();
        });
        let name = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(name.as_deref(), Some("peer"));
        // A task blocked on a hung share (a blocking call that does not return) does not
        // hold the stop.
        peer.handle().spawn(async {
            let _ =
                tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_secs(30))).await;
        });
        let handle = peer.handle().clone();
        let stopping = std::time::Instant::now();
        drop(peer);
        assert!(
            stopping.elapsed() < Duration::from_secs(5),
            "{:?}",
            stopping.elapsed()
        );
        // Once stopped, a spawned task never runs (and spawning does not panic).
        handle.spawn(async move {
            tx.send(Some("ran after the stop".into())).unwrap();
        });
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    }
}
