//! The reconcile policy of a live cluster: which children it needs and in what order, and
//! what may change (members grow one at a time, volumes only grow, an image change is an
//! upgrade); the scaling and backup steps are in [`crate::controller::decide::membership`] and [`crate::controller::pass::backup`].

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use crate::api::v1::EtcdCluster;
use crate::controller::decide::observation::{Activity, Observation};
use crate::controller::machinery::children::{Applied, Children};
use crate::controller::machinery::context::Context;
use crate::controller::machinery::error::Error;
use crate::controller::{
    decide::upgrade, pass::backup, pass::certificates, pass::claims, pass::restore, pass::scale,
    pass::storage, render,
};

fn template_image(sts: &StatefulSet) -> Option<String> {
    render::template_member(sts)?.image.clone()
}

fn template_storage_gib(sts: &StatefulSet) -> Option<i64> {
    let q = sts
        .spec
        .volume_claim_templates
        .as_ref()?
        .first()?
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")?;
    crate::api::quantity::gib(&q.0)
}

fn spec_storage_gib(ec: &EtcdCluster) -> Option<i64> {
    ec.spec
        .storage_size
        .parse::<crate::api::StorageSize>()
        .ok()
        .map(crate::api::StorageSize::gib)
}

/// The webhook's rules, once more: a cluster that got in while the webhook was bypassed
/// (failurePolicy Ignore, or created before it was installed) is not acted on.
pub(crate) fn check_spec(ec: &EtcdCluster) -> Result<(), Error> {
    use crate::admission::validate::{Operation, validate};
    let object = serde_json::to_value(ec).expect("an EtcdCluster serializes");
    let mut verdict = validate(crate::api::Version::V1, Operation::Create, &object, None);
    // A destination the backups cannot serve stops the backups only (BackupReady False with
    // the same words, and a Warning), never the members: a cluster stored before the rule
    // tightened keeps running.
    let destination = crate::admission::Field::BackupDestination.path(crate::api::Version::V1);
    verdict.violations.retain(|v| v.path != destination);
    if verdict.allowed() {
        Ok(())
    } else {
        Err(Error::InvalidSpec(format!(
            "the spec breaks the webhook's rules, so nothing is changed: {}",
            verdict.message()
        )))
    }
}

/// One pass over a live (not deleted) cluster: children, then what the status needs.
pub(crate) async fn apply_children(ec: &EtcdCluster, ctx: &Context) -> Result<Observation, Error> {
    let name = ec.name_any();
    let opts = &ctx.settings.render;
    let kids = Children::of(ec, ctx);
    let mut seen = Observation::default();

    let observed = kids.read::<StatefulSet>(&name).await?;
    // The release rendered this pass: the next minor only once every member runs the minimum
    // patch before it (upgrade::pace); `run` is the cluster as rendered.
    let running: Vec<(&str, bool)> = ec
        .status
        .as_ref()
        .and_then(|s| s.members.as_ref())
        .into_iter()
        .flatten()
        .map(|m| (m.version.as_str(), m.healthy))
        .collect();
    let template_version = observed
        .as_deref()
        .and_then(template_image)
        .and_then(|i| i.rsplit_once(':').map(|(_, tag)| tag.to_owned()));
    let (version, held) = upgrade::pace(&ec.spec.version, template_version.as_deref(), &running);
    let paced;
    let run: &EtcdCluster = if version == ec.spec.version {
        ec
    } else {
        let mut c = ec.clone();
        c.spec.version = version;
        paced = c;
        &paced
    };

    kids.ensure(&render::headless_service(ec)).await?;
    kids.ensure(&render::client_service(run)).await?;
    match render::network_policy(ec, opts) {
        Some(policy) => {
            kids.ensure(&policy).await?;
        }
        None => {
            kids.remove::<k8s_openapi::api::networking::v1::NetworkPolicy>(&name)
                .await?;
        }
    }
    certificates::ensure(ec, &kids).await?;
    if crate::api::tls_on(&ec.spec) {
        let pods = crate::controller::pass::members::member_pods(ec, &kids).await?;
        seen.trust = certificates::trust(ec, &kids, &pods).await?;
    }

    // A restore in place clears what the lost cluster left before anything else is made.
    if restore::clear(ec, &kids, &mut seen).await? {
        return Ok(seen);
    }

    let mut apply_set = true;
    // Members the StatefulSet runs after this pass (below spec.size while growing).
    let mut members;
    if let Some(current) = &observed {
        seen.ready = current
            .status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0);
        let replicas = current.spec.replicas.unwrap_or(0);
        if replicas > ec.spec.size && current.metadata.deletion_timestamp.is_none() {
            return Err(Error::InvalidSpec(format!(
                "spec.size {} is below the {replicas} members running; members are never removed (set spec.size back to {replicas})",
                ec.spec.size
            )));
        }
        if let (Some(have), Some(want)) = (template_storage_gib(current), spec_storage_gib(ec))
            && want < have
        {
            return Err(Error::InvalidSpec(format!(
                "spec.storageSize {want}Gi is below the {have}Gi the members have; volumes never shrink (set it back to {have}Gi)"
            )));
        }
        members = replicas.max(1);
        if current.metadata.deletion_timestamp.is_some() {
            // Being replaced (storage growth): wait until it is gone, then create it again.
            seen.activity = Some(Activity::ResizingStorage);
            apply_set = false;
        } else if let (Some(have), Some(want)) =
            (template_storage_gib(current), spec_storage_gib(ec))
            && want > have
        {
            storage::resize_storage(ec, &kids, replicas, have, want).await?;
            seen.activity = Some(Activity::ResizingStorage);
            apply_set = false;
        } else {
            let ready = seen.ready;
            members = scale::converge(ec, &kids, replicas, ready, &mut seen).await?;
        }
    } else if let Some(going) =
        crate::controller::pass::members::claims_being_deleted(ec, &kids).await?
    {
        // A cluster re-created at once under the same name: the former one's member claims
        // are still being deleted. Acting now would take them for a former cluster's volumes
        // (and join it) or, for a restore, leave them unrestored; wait until they are gone.
        seen.membership = Some(crate::controller::decide::observation::Membership {
            note: Some(format!(
                "the member claims {going} of a former cluster named {name} are being deleted; the members start once they are gone"
            )),
            ..Default::default()
        });
        seen.settle = true;
        members = 0;
        apply_set = false;
    } else if restore::prepare(ec, &kids, &mut seen).await? {
        members = crate::controller::pass::members::bootstrap(ec, &kids).await?;
    } else {
        // Restoring: no StatefulSet until every member's data is in place.
        members = 0;
        apply_set = false;
    }
    if apply_set {
        let mut desired = render::stateful_set(run, members, opts);
        let quota = observed.as_deref().and_then(render::template_quota);
        if let Some((smallest, small)) = storage::not_grown(ec, &kids, members).await?
            && let Some(held) = render::hold_quota_until_grown(Some(smallest), &mut desired)
        {
            tracing::info!(
                cluster = %name,
                held,
                claims = %small.join(", "),
                "the quota stays what the volumes hold now until every one has grown"
            );
            seen.activity = Some(Activity::ResizingStorage);
        }
        if let Some(kept) = render::keep_running_quota(ec, quota, &mut desired) {
            tracing::warn!(
                cluster = %name,
                kept,
                "the members' databases are near the quota the volume's rule now gives; the quota they run with is kept (grow spec.storageSize to give a defragmentation room)"
            );
        }
        let (applied, set) = kids.ensure(&desired).await?;
        let (old_image, new_image) = (
            observed.as_deref().and_then(template_image),
            template_image(&desired),
        );
        match applied {
            Applied::Created if observed.is_none() => {
                ctx.event(
                    ec,
                    EventType::Normal,
                    "Created",
                    format!(
                        "StatefulSet {name} with {} members of etcd {}",
                        ec.spec.size, ec.spec.version
                    ),
                )
                .await;
            }
            Applied::Updated if old_image.is_some() && old_image != new_image => {
                ctx.event(
                    ec,
                    EventType::Normal,
                    "Upgrading",
                    format!(
                        "{} -> {}",
                        old_image.unwrap_or_default(),
                        new_image.unwrap_or_default()
                    ),
                )
                .await;
                seen.activity = Some(Activity::Upgrading);
            }
            _ => {}
        }
        // No "updateRevision != currentRevision" check for an upgrade under way: with OnDelete
        // the StatefulSet controller never moves currentRevision, so it is what
        // `upgrade::roll` finds in the pods' revisions.
        if let Some(s) = set.status.as_ref()
            && seen.membership.as_ref().is_none_or(|m| m.voters == 0)
        {
            seen.ready = s.ready_replicas.unwrap_or(0);
        }
        if observed.is_some() {
            let health = upgrade::Health {
                settled: seen
                    .membership
                    .as_ref()
                    .is_some_and(|m| m.converged(ec.spec.size) && m.healthy_voters == m.voters),
                leader: seen.leader,
            };
            let pods = crate::controller::pass::members::member_pods(ec, &kids).await?;
            crate::controller::pass::upgrade::roll(run, &kids, &set, &pods, health, &mut seen)
                .await?;
        }
        if let Some(why) = held {
            seen.activity = Some(crate::controller::decide::observation::Activity::Upgrading);
            seen.progress
                .get_or_insert_with(|| format!("upgrading to {}: {why}", ec.spec.version));
        }
    }

    kids.ensure(&render::pod_disruption_budget(ec, seen.voters))
        .await?;
    claims::tend(ec, &kids).await?;
    crate::controller::pass::maintenance::tend(ec, &kids, &mut seen).await;

    backup::schedule(ec, &kids, &mut seen).await?;
    backup::observe(ec, &kids, &mut seen).await?;
    Ok(seen)
}
