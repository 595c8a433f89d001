//! `relay-standin [PORT] [SCRIPT.json]`: the stand-in for manual use. Prints the base URL, then
//! one line per request answered (kind, rule, the latest user message), until interrupted.

use std::time::Duration;

use relay_standin::{Script, StandIn};

fn main() {
    let mut args = std::env::args().skip(1);
    let port: u16 = match args.next().map(|p| p.parse()) {
        None => 0,
        Some(Ok(p)) => p,
        Some(Err(_)) => fail("usage: relay-standin [PORT] [SCRIPT.json]"),
    };
    let script = match args.next() {
        None => Script::default(),
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| fail(&format!("cannot read {path}: {e}")));
            Script::from_json(&text).unwrap_or_else(|e| fail(&format!("{path}: {e}")))
        }
    };
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let standin = StandIn::start_on(addr, script).unwrap_or_else(|e| fail(&e.to_string()));
    println!("ANTHROPIC_BASE_URL={}", standin.base_url());
    let mut seen = 0;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let log = standin.requests();
        for r in &log[seen..] {
            let text: String = r
                .user_text
                .chars()
                .filter(|c| !c.is_control())
                .take(100)
                .collect();
            println!(
                "{:?} {} rule={:?} model={} user={text:?}",
                r.kind, r.path, r.rule, r.model
            );
            if std::env::var_os("RELAY_STANDIN_BODIES").is_some() {
                println!("  body: {}", r.body);
            }
        }
        seen = log.len();
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("relay-standin: {msg}");
    std::process::exit(2)
}
