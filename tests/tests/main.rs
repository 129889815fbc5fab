//! Integration tests: real `llm-replay` processes (coordinator, workers, mock) talking over
//! real sockets on loopback. One binary, shared fixtures in `fixtures`.

mod capacity;
mod capture;
mod capture_limits;
mod capture_upstream;
mod connections;
mod containers;
mod distributed;
mod example;
mod failures_measured;
mod faithful;
mod faults;
mod goals;
mod hardening;
mod hostile_peers;
mod html_report;
mod ingress;
mod library_run;
mod live_metrics;
mod memory;
mod otel_import;
mod raw_server;
mod real_traffic;
mod repository;
mod security_link;
mod security_outputs;
mod security_recordings;
mod security_transport;
mod server_side;
mod significance;
mod timing;
mod transport;
mod usage;
mod wide_area;
mod wide_area_clock;
mod wide_area_loss;
