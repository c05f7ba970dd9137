pub mod backoff;
