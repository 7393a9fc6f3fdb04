//! Development certificates (`etcd-webhook certs`, and the embedded default of `serve`): a CA
//! and a serving pair signed by it, ECDSA P-256. Optionally written in the kubelet's layout for
//! a Secret volume, to rehearse rotations.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use super::{CA_FILE, CERT_FILE, CertError, KEY_FILE};

/// PEM text of a freshly issued development CA and serving pair.
#[derive(Clone, Debug)]
pub struct DevCerts {
    pub ca_cert: String,
    pub cert: String,
    pub key: String,
}

/// Issues a CA and a serving certificate for `dns` and `ips`, valid for `days`.
pub fn generate(dns: &[String], ips: &[IpAddr], days: i64) -> Result<DevCerts, CertError> {
    let now = OffsetDateTime::now_utc();
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "etcd-webhook development CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = now - Duration::hours(1);
    ca.not_after = now + Duration::days(days);
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(dns.to_vec())?;
    leaf.subject_alt_names
        .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    leaf.distinguished_name.push(
        DnType::CommonName,
        dns.first()
            .cloned()
            .unwrap_or_else(|| "etcd-webhook".to_owned()),
    );
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = now - Duration::hours(1);
    leaf.not_after = now + Duration::days(days);
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok(DevCerts {
        ca_cert: ca_cert.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

impl DevCerts {
    /// The three files of a cert-manager Secret.
    pub fn files(&self) -> [(&'static str, &[u8]); 3] {
        [
            (CA_FILE, self.ca_cert.as_bytes()),
            (CERT_FILE, self.cert.as_bytes()),
            (KEY_FILE, self.key.as_bytes()),
        ]
    }

    /// Writes `ca.crt`, `tls.crt` and `tls.key` (mode 0600) straight into `dir`.
    pub fn write_plain(&self, dir: &Path) -> Result<(), CertError> {
        create_dir(dir)?;
        for (name, bytes) in self.files() {
            write_file(&dir.join(name), bytes)?;
        }
        Ok(())
    }
}

fn create_dir(dir: &Path) -> Result<(), CertError> {
    std::fs::create_dir_all(dir).map_err(|source| CertError::Write {
        path: dir.to_owned(),
        source,
    })
}

/// Writes a file readable by its owner only (keys among them), replacing it in one rename.
fn write_file(path: &Path, bytes: &[u8]) -> Result<(), CertError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| CertError::Write {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// Writes `files` the way the kubelet updates a Secret volume: a new `..<timestamp>` folder, a
/// `..data_tmp` symlink to it renamed over `..data`, a `<name> -> ..data/<name>` link per file,
/// and the previous folder removed. Returns the new folder.
pub fn write_kubelet_layout(dir: &Path, files: &[(&str, &[u8])]) -> Result<PathBuf, CertError> {
    use std::os::unix::fs::symlink;
    create_dir(dir)?;
    let err = |path: &Path| {
        let path = path.to_owned();
        move |source| CertError::Write { path, source }
    };
    let data = dir.join("..data");
    let previous = std::fs::read_link(&data).ok();
    let stamp = OffsetDateTime::now_utc();
    let name = format!(
        "..{}_{:02}_{:02}_{:02}_{:02}_{:02}.{:09}",
        stamp.year(),
        u8::from(stamp.month()),
        stamp.day(),
        stamp.hour(),
        stamp.minute(),
        stamp.second(),
        stamp.nanosecond()
    );
    let folder = dir.join(&name);
    create_dir(&folder)?;
    for (file, bytes) in files {
        write_file(&folder.join(file), bytes)?;
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(&name, &tmp).map_err(err(&tmp))?;
    std::fs::rename(&tmp, &data).map_err(err(&data))?;
    for (file, _) in files {
        let link = dir.join(file);
        if std::fs::read_link(&link).is_err() {
            let _ = std::fs::remove_file(&link);
            symlink(Path::new("..data").join(file), &link).map_err(err(&link))?;
        }
    }
    if let Some(prev) = previous
        && prev != Path::new(&name)
    {
        let _ = std::fs::remove_dir_all(dir.join(prev));
    }
    Ok(folder)
}
