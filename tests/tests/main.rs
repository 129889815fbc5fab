//! Integration tests: real `llm-replay` processes (coordinator, workers, mock) talking over
//! real sockets on loopback. One binary, shared fixtures in `fixtures`.

mod capture;
mod distributed;
mod example;
mod faults;
mod goals;
mod memory;
mod timing;
mod transport;
mod usage;
