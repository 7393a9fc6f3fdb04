//! What the certificate code reports (`tls::Report`), counted.

use super::Metrics;
use super::labels::{CertLabels, ObjectLabel, ResultLabel};
use crate::tls::{self, CertInfo};

impl tls::Report for Metrics {
    fn cert_loaded(&self, info: &CertInfo) {
        self.cert_not_after.set(info.not_after);
        self.cert_info.clear();
        self.cert_info
            .get_or_create(&CertLabels {
                serial: info.serial.clone(),
                subject: info.subject.clone(),
            })
            .set(1);
        self.cert_reloads
            .get_or_create(&ResultLabel { result: "success" })
            .inc();
        self.cert_last_reload.set(tls::now());
        self.cert_files_rejected.set(0);
    }

    fn cert_rejected(&self) {
        self.cert_reloads
            .get_or_create(&ResultLabel { result: "failure" })
            .inc();
        self.cert_files_rejected.set(1);
    }

    fn client_ca_reloaded(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.client_ca_reloads
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    fn secret_watch_failing(&self, failing: bool) {
        self.cert_secret_watch_failing.set(i64::from(failing));
    }

    fn cabundle_mismatch(&self, object: &str, mismatch: bool) {
        self.cabundle_mismatch
            .get_or_create(&ObjectLabel {
                object: object.to_owned(),
            })
            .set(i64::from(mismatch));
    }
}
