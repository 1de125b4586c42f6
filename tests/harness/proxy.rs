//! A TCP proxy between the server and Postgres, for outages: `cut` closes every connection and
//! refuses new ones (the server sees what it would see if the database host went away),
//! `restore` lets them through again. Loopback only.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct DbProxy {
    /// The database URL with the proxy's address instead of Postgres'.
    pub url: String,
    cut: Arc<AtomicBool>,
    generation: watch::Sender<u64>,
}

impl DbProxy {
    /// Starts a proxy for the database at `target_url` (`postgres://user:pw@127.0.0.1:port/db`).
    pub async fn start(target_url: &str) -> DbProxy {
        let (prefix, rest) = target_url.split_once('@').expect("a URL with user@host");
        let (host_port, database) = rest.split_once('/').expect("a URL with /database");
        let target = host_port.to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("{prefix}@{}/{database}", listener.local_addr().unwrap());
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let (accept_cut, accept_generation) = (Arc::clone(&cut), generation.clone());
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { return };
                if accept_cut.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let target = target.clone();
                let mut cuts = accept_generation.subscribe();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&target).await else { return };
                    let (mut client, mut server) = (client, server);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        DbProxy { url, cut, generation }
    }

    /// Closes every connection through the proxy and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}
