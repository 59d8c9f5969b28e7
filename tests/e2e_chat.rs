mod common;
use common::*;
#[test]
fn probe() {
    let t = std::time::Instant::now();
    let d = Daemon::start(&[], Some(&config_with_idle_timeout(1000)));
    eprintln!("start {:?}", t.elapsed());
    eprintln!("{:#}", d.capacity());
    let log = ChatClient::start(d.addr, "seed=1").run(&signal(0, 25), Pace::RealTime);
    eprintln!("rt {}", log.summary());
    eprintln!("texts {:?}", log.texts);
    let log = ChatClient::start(d.addr, "seed=1").run(&signal(0, 20), Pace::Burst);
    eprintln!("burst {}", log.summary());
    eprintln!("{:#}", d.wait_idle());
    eprintln!("{}", d.stderr());
}
