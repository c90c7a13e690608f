//! The store layer: what the engine knows of every sandbox and task, kept so that it survives
//! any process: the catalog (SQLite, `catalog`, opened and rebuilt by `catalog_file`, guarded
//! against a repair by `catalog_lock`) and one record file per sandbox or task (`records`),
//! the source a damaged catalog is rebuilt from.
//!
//! It may import the foundation, the model and the host layer, nothing above them.

pub mod catalog;
pub(crate) mod catalog_file;
pub(crate) mod catalog_lock;
pub mod records;
