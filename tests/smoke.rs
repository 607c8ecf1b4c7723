#[test] fn smoke() {}
