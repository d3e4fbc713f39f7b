//! Where runs are kept, and how a store is opened: the state directory's SQLite file by
//! default, or a store named by a URL, found by its scheme in [`URL_STORES`] (a table of
//! registrations, as jj-lib builds its backends by name). A new store is a module of
//! `store/` and one line in that table; nothing outside `store/` names it.

use std::path::{Path, PathBuf};

use super::shared::SharedStore;
use super::{Result, STORE_ENV, Store, StoreError, sqlite};

/// How a store is opened, whatever it is: each store maps what applies to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Every commit on the disk before it returns, so that it survives a power loss
    /// (`--full-sync`; SQLite's `synchronous=FULL`). A server store is durable by itself
    /// and ignores it.
    pub full_sync: bool,
    /// Opened only to be read (`status`, `logs`, a cancel watcher): a store that waits on a
    /// lost connection says so in the log rather than on stderr.
    pub read_only: bool,
}

/// A store as its registration opens it: of records only, or shared by many processes
/// (with what [`SharedStore`] adds).
pub enum Opened {
    Local(Box<dyn Store + Send>),
    Shared(Box<dyn SharedStore>),
}

impl Opened {
    /// The store of records.
    pub fn into_store(self) -> Box<dyn Store + Send> {
        match self {
            Opened::Local(s) => s,
            Opened::Shared(s) => s.into_store(),
        }
    }
}

/// A store that a URL names.
pub struct Registration {
    /// The URL prefixes that name it (`postgres://`).
    pub schemes: &'static [&'static str],
    /// Whether it is shared by many processes and machines (runs on workers need one).
    pub shared: bool,
    /// Opens it (connecting, creating its schema when needed).
    pub open: fn(url: &str, options: &OpenOptions) -> Result<Opened>,
    /// The URL as messages show it (without a password).
    pub shown: fn(url: &str) -> String,
}

/// Every store a URL can name, by scheme.
pub const URL_STORES: &[Registration] = &[super::postgres::REGISTRATION];

fn registration(url: &str) -> Option<&'static Registration> {
    URL_STORES
        .iter()
        .find(|r| r.schemes.iter().any(|s| url.starts_with(s)))
}

/// Where runs are kept: the SQLite file of a state directory (the default), or a store
/// named by a URL (a PostgreSQL database that many processes share).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// `STATE_DIR/state.db`.
    StateDir(PathBuf),
    /// A URL whose scheme names a registered store (`postgres://...`).
    Url(String),
}

impl Location {
    /// The store `--store` names (else [`STORE_ENV`]), or the state directory's SQLite file.
    pub fn new(store: Option<&str>, state_dir: &Path) -> Result<Location> {
        let from_env = std::env::var(STORE_ENV).ok().filter(|v| !v.is_empty());
        match store.map(str::to_string).or(from_env) {
            None => Ok(Location::StateDir(state_dir.to_path_buf())),
            Some(url) if registration(&url).is_some() => Ok(Location::Url(url)),
            Some(other) => Err(StoreError::NotAStore {
                given: crate::text::printable(&other).into_owned(),
                schemes: URL_STORES
                    .iter()
                    .filter_map(|r| r.schemes.first().copied())
                    .collect::<Vec<_>>()
                    .join(" or "),
            }),
        }
    }

    /// The state directory whose SQLite file this is, if it is one.
    pub fn state_dir(&self) -> Option<&Path> {
        match self {
            Location::StateDir(dir) => Some(dir),
            Location::Url(_) => None,
        }
    }

    /// Whether the store is shared by many processes and machines (runs on workers).
    pub fn is_shared(&self) -> bool {
        match self {
            Location::StateDir(_) => false,
            Location::Url(url) => registration(url).is_some_and(|r| r.shared),
        }
    }

    /// Whether the store may hold runs already (a SQLite file is made by the first run).
    pub fn exists(&self) -> bool {
        match self {
            Location::StateDir(dir) => sqlite::default_path(dir).exists(),
            Location::Url(_) => true,
        }
    }

    fn open_url(url: &str, options: &OpenOptions) -> Result<Opened> {
        match registration(url) {
            Some(r) => (r.open)(url, options),
            None => Err(StoreError::NotAStore {
                given: crate::text::printable(url).into_owned(),
                schemes: String::new(),
            }),
        }
    }

    /// Opens the store (creating a SQLite file, or the schema of a database, when needed).
    pub fn open(&self, options: &OpenOptions) -> Result<Box<dyn Store + Send>> {
        match self {
            Location::StateDir(dir) => {
                let durability = if options.full_sync {
                    sqlite::Durability::Full
                } else {
                    sqlite::Durability::Normal
                };
                let mut store =
                    sqlite::SqliteStore::open_with(&sqlite::default_path(dir), durability)?;
                store.on_busy(report_wait);
                Ok(Box::new(store))
            }
            Location::Url(url) => Ok(Self::open_url(url, options)?.into_store()),
        }
    }

    /// Opens the store with what a shared store can do (a run queue, units of work,
    /// workers, change notifications); `None`, without opening anything, for a store that
    /// is not shared.
    pub fn open_shared(&self, options: &OpenOptions) -> Result<Option<Box<dyn SharedStore>>> {
        match self {
            Location::StateDir(_) => Ok(None),
            Location::Url(url) => match Self::open_url(url, options)? {
                Opened::Shared(s) => Ok(Some(s)),
                Opened::Local(_) => Ok(None),
            },
        }
    }

    /// Opens an existing store to read it: a SQLite file read-only (brought up to date first
    /// if it is older); `None` when there is no SQLite file yet.
    pub fn open_to_read(&self) -> Result<Option<Box<dyn Store + Send>>> {
        match self {
            Location::StateDir(dir) => {
                let path = sqlite::default_path(dir);
                if !path.exists() {
                    return Ok(None);
                }
                match sqlite::SqliteStore::open_read_only(&path) {
                    Ok(store) => Ok(Some(Box::new(store))),
                    Err(read_only) => Ok(Some(Box::new(
                        sqlite::SqliteStore::open(&path).map_err(|_| read_only)?,
                    ))),
                }
            }
            Location::Url(url) => {
                let options = OpenOptions {
                    read_only: true,
                    ..OpenOptions::default()
                };
                Ok(Some(Self::open_url(url, &options)?.into_store()))
            }
        }
    }
}

/// Says on stderr that a store call waits (a busy file, a lost connection), its secrets
/// masked.
pub(crate) fn report_wait(message: &str) {
    let message = crate::secrets::redact(message);
    eprintln!("! store: {}", crate::text::printable(&message));
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::StateDir(dir) => write!(f, "{}", dir.display()),
            Location::Url(url) => match registration(url) {
                Some(r) => f.write_str(&(r.shown)(url)),
                None => f.write_str("a store"),
            },
        }
    }
}
