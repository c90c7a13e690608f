//! Measures what the proxy itself costs, on loopback only: a bulk download through
//! `Proxy::serve` against the same download direct, and the time per new connection (CONNECT,
//! 200, ClientHello, a one-byte answer) through the proxy against direct.
//!
//! `cargo run --release -p dynocap-netproxy --example bench [MEGABYTES] [CONNECTIONS]`
//!
//! The origin is a plain TCP server on 127.0.0.1 that reads one TLS record (the ClientHello
//! from the fixture captured from curl) and answers with the requested number of bytes; the
//! proxy reaches it through a resolve override, so nothing is resolved and nothing leaves
//! the loopback interface. The guest tunnel is not part of this measurement.

use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dynocap_netproxy::{NullSink, Policy, Proxy, ResolveOverrides};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

const HELLO_HEX: &str = include_str!("../tests/fixtures/client_hello_example_com.hex");

fn hello() -> Result<Vec<u8>> {
    let hex: String = HELLO_HEX.split_whitespace().collect();
    (0..hex.len())
        .step_by(2)
        .map(|i| Ok(u8::from_str_radix(&hex[i..i + 2], 16)?))
        .collect()
}

/// Serves each connection: reads one TLS record, then writes the size it was told (an 8-byte
/// big-endian number after the record) worth of zeros.
async fn origin() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = serve_origin(&mut stream).await;
            });
        }
    });
    Ok(addr)
}

async fn serve_origin(stream: &mut TcpStream) -> Result<()> {
    stream.set_nodelay(true)?;
    let mut header = [0u8; 5];
    stream.read_exact(&mut header).await?;
    let mut record = vec![0u8; usize::from(u16::from_be_bytes([header[3], header[4]]))];
    stream.read_exact(&mut record).await?;
    let mut size = [0u8; 8];
    stream.read_exact(&mut size).await?;
    let mut left = u64::from_be_bytes(size);
    let chunk = vec![0u8; 256 * 1024];
    while left > 0 {
        let n = usize::try_from(left.min(chunk.len() as u64))?;
        stream.write_all(&chunk[..n]).await?;
        left -= n as u64;
    }
    stream.shutdown().await?;
    Ok(())
}

/// Accepts connections and hands each to the proxy, as the supervisor does with tunnels.
async fn proxy(origin: SocketAddr) -> Result<SocketAddr> {
    let mut overrides = ResolveOverrides::none();
    overrides.insert("example.com", 443, origin)?;
    let proxy = Arc::new(Proxy::new(
        Policy::https_hosts(&["example.com"])?,
        overrides,
        Arc::new(NullSink),
    ));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let proxy = proxy.clone();
            tokio::spawn(async move {
                let _ = stream.set_nodelay(true);
                proxy.serve(stream).await;
            });
        }
    });
    Ok(addr)
}

/// One download of `size` bytes; through the proxy when `via_proxy`.
async fn fetch(target: SocketAddr, via_proxy: bool, hello: &[u8], size: u64) -> Result<u64> {
    let mut stream = TcpStream::connect(target).await?;
    stream.set_nodelay(true)?;
    if via_proxy {
        stream
            .write_all(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
            .await?;
        expect_established(&mut stream).await?;
    }
    let mut first = hello.to_vec();
    first.extend_from_slice(&size.to_be_bytes());
    stream.write_all(&first).await?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    if got != size {
        return Err(format!("expected {size} bytes, got {got}").into());
    }
    Ok(got)
}

async fn expect_established<S: AsyncRead + Unpin>(stream: &mut S) -> Result<()> {
    const OK: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";
    let mut answer = vec![0u8; OK.len()];
    stream.read_exact(&mut answer).await?;
    if answer != OK {
        return Err(format!("proxy answered {:?}", String::from_utf8_lossy(&answer)).into());
    }
    Ok(())
}

async fn timed(
    target: SocketAddr,
    via_proxy: bool,
    hello: &[u8],
    size: u64,
    count: u32,
) -> Result<Duration> {
    let start = Instant::now();
    for _ in 0..count {
        fetch(target, via_proxy, hello, size).await?;
    }
    Ok(start.elapsed())
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let megabytes: u64 = args.next().map_or(Ok(200), |a| a.parse())?;
    let connections: u32 = args.next().map_or(Ok(500), |a| a.parse())?;
    let hello = hello()?;
    let origin = origin().await?;
    let proxy = proxy(origin).await?;
    let size = megabytes * 1024 * 1024;

    // Warm up both paths once, then take the best of three for the bulk transfer.
    timed(origin, false, &hello, size, 1).await?;
    timed(proxy, true, &hello, size, 1).await?;
    let mut direct = Duration::MAX;
    let mut proxied = Duration::MAX;
    for _ in 0..3 {
        direct = direct.min(timed(origin, false, &hello, size, 1).await?);
        proxied = proxied.min(timed(proxy, true, &hello, size, 1).await?);
    }
    let mib_s = |d: Duration| megabytes as f64 / d.as_secs_f64();
    println!(
        "bulk {megabytes} MiB: direct {:.0} MiB/s, proxied {:.0} MiB/s, ratio {:.2}",
        mib_s(direct),
        mib_s(proxied),
        direct.as_secs_f64() / proxied.as_secs_f64()
    );

    let direct = timed(origin, false, &hello, 1, connections).await?;
    let proxied = timed(proxy, true, &hello, 1, connections).await?;
    let per = |d: Duration| d.as_secs_f64() * 1000.0 / f64::from(connections);
    println!(
        "{connections} connections: direct {:.3} ms each, proxied {:.3} ms each, added {:.3} ms",
        per(direct),
        per(proxied),
        per(proxied) - per(direct)
    );
    Ok(())
}
