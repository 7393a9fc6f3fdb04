//! Where snapshots are filed (`s3://bucket/prefix` or a folder), how a snapshot URI is found
//! again, and where the S3 credentials come from.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path as StorePath;

use super::error::Error;

/// Where snapshots are filed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// `s3://bucket/prefix`.
    S3 { bucket: String, prefix: String },
    /// A folder (the backup claim's mount).
    Folder(std::path::PathBuf),
}

impl Destination {
    pub fn parse(s: &str) -> Result<Destination, Error> {
        if let Some(rest) = s.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(Error::Usage(format!("destination {s:?} names no bucket")));
            }
            return Ok(Destination::S3 {
                bucket: bucket.to_owned(),
                prefix: prefix.trim_matches('/').to_owned(),
            });
        }
        if s.starts_with('/') {
            return Ok(Destination::Folder(s.into()));
        }
        Err(Error::Usage(format!(
            "destination {s:?}: use s3://bucket/prefix or an absolute folder path"
        )))
    }

    /// The URI of a snapshot named `name` here.
    pub fn uri(&self, name: &str) -> String {
        match self {
            Destination::S3 { bucket, prefix } if prefix.is_empty() => {
                format!("s3://{bucket}/{name}")
            }
            Destination::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}/{name}"),
            Destination::Folder(dir) => dir.join(name).display().to_string(),
        }
    }

    pub(crate) fn prefix(&self) -> &str {
        match self {
            Destination::S3 { prefix, .. } => prefix,
            Destination::Folder(_) => "",
        }
    }

    pub(crate) fn path(&self, name: &str) -> StorePath {
        match self.prefix() {
            "" => StorePath::from(name),
            p => StorePath::from(format!("{p}/{name}")),
        }
    }

    /// The store: S3 from the usual `AWS_*` variables (keys, `AWS_REGION`, `AWS_ENDPOINT_URL`
    /// for an S3-compatible store, web identity or instance credentials when no keys are
    /// given), path-style addressing unless `AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`, plain
    /// HTTP allowed for an `http://` endpoint; or the folder.
    pub fn open(&self) -> Result<Arc<dyn ObjectStore>, Error> {
        let fail = |e: object_store::Error| Error::Store {
            step: "open",
            uri: self.uri(""),
            source: Box::new(e),
        };
        match self {
            Destination::S3 { bucket, .. } => {
                let source = credentials(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
                    .map_err(|why| Error::Store {
                        step: "open",
                        uri: self.uri(""),
                        source: why.into(),
                    })?;
                tracing::debug!(credentials = source, "S3 credentials");
                let mut builder =
                    object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
                let endpoint = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
                    .iter()
                    .find_map(|k| std::env::var(k).ok());
                if endpoint
                    .as_deref()
                    .is_some_and(|e| e.starts_with("http://"))
                {
                    builder = builder.with_allow_http(true);
                }
                if std::env::var("AWS_REGION").is_err()
                    && std::env::var("AWS_DEFAULT_REGION").is_err()
                {
                    builder = builder.with_region("us-east-1");
                }
                Ok(Arc::new(builder.build().map_err(fail)?))
            }
            Destination::Folder(dir) => Ok(Arc::new(
                object_store::local::LocalFileSystem::new_with_prefix(dir).map_err(fail)?,
            )),
        }
    }
}

/// Where the S3 credentials come from, read from the environment as the S3 client reads it:
/// keys, a web identity (IRSA), the container credentials endpoint, or else the instance
/// metadata service; with that turned off (`AWS_EC2_METADATA_DISABLED=true`) and nothing
/// else, "no credentials" in words that say what to set, instead of the metadata service's
/// refusal.
pub fn credentials(env: impl Fn(&str) -> Option<String>) -> Result<&'static str, String> {
    match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        (Some(_), Some(_)) => return Ok("keys"),
        (Some(_), None) => {
            return Err("AWS_ACCESS_KEY_ID is set without AWS_SECRET_ACCESS_KEY (the Secret NAME-backup-credentials needs both)".to_owned());
        }
        (None, Some(_)) => {
            return Err("AWS_SECRET_ACCESS_KEY is set without AWS_ACCESS_KEY_ID (the Secret NAME-backup-credentials needs both)".to_owned());
        }
        (None, None) => {}
    }
    if env("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() && env("AWS_ROLE_ARN").is_some() {
        return Ok("web identity");
    }
    if env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
        || env("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some()
    {
        return Ok("container credentials");
    }
    if env("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Err("no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the Secret NAME-backup-credentials), or give the pods a cloud identity (--backup-service-account); the instance metadata service is off (AWS_EC2_METADATA_DISABLED)".to_owned());
    }
    Ok("instance metadata")
}

/// Where a snapshot named by a URI is: its store, its path there.
pub fn locate(from: &str) -> Result<(Destination, StorePath), Error> {
    let (dir, name) = from
        .rsplit_once('/')
        .filter(|(_, name)| !name.is_empty())
        .ok_or_else(|| Error::Usage(format!("snapshot {from:?} names no file")))?;
    let destination = if dir == "s3:/" {
        return Err(Error::Usage(format!("snapshot {from:?} names no bucket")));
    } else if dir.is_empty() {
        Destination::Folder("/".into())
    } else {
        Destination::parse(dir)?
    };
    let path = destination.path(name);
    Ok((destination, path))
}
