pub use kstate_core;
pub use kstate_rocksdb;
