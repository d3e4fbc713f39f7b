//! Large outputs: spilled to `<db dir>/blobs/<sha256>.json` (synced and renamed into place
//! before the commit that refers to them) and read back transparently.

use std::fs;
use std::io::Write as _;
use std::path::PathBuf;

use sha2::{Digest, Sha256};

use super::SqliteStore;
use crate::store::{Result, StoreError};

/// Outputs whose JSON text is longer than this many bytes are kept in a file beside the store.
pub const SPILL_BYTES: usize = 64 * 1024;

/// A node's output as stored: serialized once, inline or as the hash of a spilled file.
#[derive(Default)]
pub(super) struct Output {
    pub(super) inline: Option<String>,
    pub(super) blob: Option<String>,
    /// The text of a spilled output whose file was there already (not written again): kept
    /// until the commit, which writes the file again if `runs prune` removed it meanwhile
    /// (see [`SqliteStore::restore_blobs`]).
    pub(super) reused: Option<String>,
}

impl SqliteStore {
    /// Serializes an output, spilling it to a blob file when it is large. Returns the output
    /// and whether a new file was written.
    pub(super) fn prepare_output(&self, output: &serde_json::Value) -> Result<(Output, bool)> {
        let text = serde_json::to_string(output)
            .map_err(|e| StoreError::json("cannot serialize an output", e))?;
        if text.len() <= SPILL_BYTES {
            return Ok((
                Output {
                    inline: Some(text),
                    ..Output::default()
                },
                false,
            ));
        }
        let hash = format!("{:x}", Sha256::digest(text.as_bytes()));
        let path = self.blob_path(&hash);
        if path.exists() {
            return Ok((
                Output {
                    blob: Some(hash),
                    reused: Some(text),
                    ..Output::default()
                },
                false,
            ));
        }
        self.write_blob(&hash, &text)?;
        Ok((
            Output {
                blob: Some(hash),
                ..Output::default()
            },
            true,
        ))
    }

    /// After a commit: writes again the spilled outputs it found already there, should
    /// `runs prune` have removed one since (it removes only files no row refers to, and this
    /// commit's rows were not there yet). Synced, as a new spill is.
    pub(super) fn restore_blobs(&self, outputs: &[Output]) -> Result<()> {
        let mut wrote = false;
        for o in outputs {
            if let (Some(hash), Some(text)) = (&o.blob, &o.reused)
                && !self.blob_path(hash).exists()
            {
                self.write_blob(hash, text)?;
                wrote = true;
            }
        }
        if wrote {
            fs::File::open(&self.blobs)
                .and_then(|dir| dir.sync_all())
                .map_err(|e| StoreError::io("sync", &self.blobs, e))?;
        }
        Ok(())
    }

    /// Writes a spilled output's file: synced, then renamed into place.
    fn write_blob(&self, hash: &str, text: &str) -> Result<()> {
        let path = self.blob_path(hash);
        let io = |e: std::io::Error| StoreError::io("write", &path, e);
        fs::create_dir_all(&self.blobs).map_err(io)?;
        let tmp = self
            .blobs
            .join(format!(".{hash}.{}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut file = fs::File::create(&tmp)?;
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
            fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(io(e));
        }
        Ok(())
    }

    pub(super) fn blob_path(&self, hash: &str) -> PathBuf {
        self.blobs.join(format!("{hash}.json"))
    }

    pub(super) fn load_output(
        &self,
        inline: Option<String>,
        blob: Option<String>,
    ) -> Result<serde_json::Value> {
        let text = match (inline, blob) {
            (_, Some(hash)) => {
                let path = self.blob_path(&hash);
                fs::read_to_string(&path)
                    .map_err(|e| StoreError::io("read the output stored in", &path, e))?
            }
            (Some(text), None) => text,
            (None, None) => return Ok(serde_json::Value::Null),
        };
        serde_json::from_str(&text)
            .map_err(|e| StoreError::json("a stored output is not valid JSON", e))
    }
}
