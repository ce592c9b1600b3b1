//! The stream engine: registry in sled, the indexer that follows the log, retention, readers.
