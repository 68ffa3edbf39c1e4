//! `/admin/releases`: publish a release (multipart upload of its files), list the
//! history, roll back to a kept release with fresh signatures, and fetch a kept
//! release's files (`release export`). The model is [`crate::releases`]; this
//! translates.

use std::collections::BTreeMap;

use agent_extract::verify::MAX_SIGNATURE_FILE;
use agent_fleet::approvals::Approval;
use agent_fleet::operators::Action;
use agent_fleet::releases::{HistoryEntry, Kind};
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Multipart, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use super::operators::{Auth, Caller};
use super::{AppState, Shared, json_body};
use crate::actions::{self, Act, DeploymentAct, Done};
use crate::error::ApiError;
use crate::releases::check::check_name;
use crate::releases::{Publisher, ReleaseError, UPLOAD_RETRY_AFTER, UPLOADS_AT_ONCE};
use crate::store::Current;

/// Largest upload: the bundles of every platform of one release, with room to spare.
pub(super) const MAX_RELEASE_BODY: usize = 1024 * 1024 * 1024;

/// Files in one upload at most (a bundle and its signature per platform).
const MAX_FILES: usize = 64;

fn publisher(s: &Shared) -> &Publisher {
    &s.releases
}

/// `?deployment=NAME` of a publish: the release is kept and named for that deployment,
/// not made the fleet's current release.
#[derive(Debug, Default, Deserialize)]
pub(super) struct PublishTo {
    deployment: Option<String>,
}

/// `POST /admin/releases`: multipart, one part per file, named by its file name.
pub(super) async fn publish(
    State(state): State<AppState>,
    Query(to): Query<PublishTo>,
    auth: Auth,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let caller = auth.require(s, Action::Change, "release.publish").await?;
    let deployment = to
        .deployment
        .filter(|d| !d.is_empty() && d != agent_fleet::deployments::DEFAULT);
    if let Some(name) = &deployment
        && agent_fleet::deployments::get(&s.fleet.db, name)
            .await?
            .is_none()
    {
        if let Ok(mut multipart) = multipart {
            drain(&mut multipart).await;
        }
        let why = format!(
            "the release is refused, nothing changed: no deployment {name:?}; create it with `update-server deployment create {name} --selector S --release V+B`, or list them with `update-server deployment list`"
        );
        caller
            .refused(
                s,
                "release.publish",
                json!({ "deployment": name, "reason": why }),
            )
            .await;
        return Err(ApiError::new(StatusCode::NOT_FOUND, why).audited());
    }
    // Held until the release is published or refused: what this upload writes to disk
    // and checks counts against the uploads one server takes at once. One over that is
    // read and dropped (no disk, no check), so its client, still sending, reads the
    // answer rather than a broken pipe.
    let Some(_slot) = publisher(s).upload_slot() else {
        if let Ok(mut multipart) = multipart {
            drain(&mut multipart).await;
        }
        let why = format!(
            "the release is refused, nothing changed: this server is receiving {UPLOADS_AT_ONCE} uploads already; publish again in {UPLOAD_RETRY_AFTER} s"
        );
        caller
            .refused(s, "release.publish", json!({ "files": [], "reason": why }))
            .await;
        return Err(ApiError::unavailable(why, UPLOAD_RETRY_AFTER).audited());
    };
    let mut multipart = multipart.map_err(|e| {
        ApiError::bad_request(format!(
            "send the release as multipart/form-data, one part per file (curl -F f=@agent-bundle-…): {}",
            e.body_text()
        ))
    })?;
    let incoming = publisher(s).incoming().map_err(ApiError::from)?;
    let mut names: Vec<String> = Vec::new();
    while let Some(mut field) = multipart.next_field().await.map_err(upload_error)? {
        let name = field
            .file_name()
            .or_else(|| field.name())
            .unwrap_or_default()
            .to_owned();
        if let Err(why) = check_name(&name) {
            return refuse(s, &caller, &names, format!("{}: {why}", shown_name(&name))).await;
        }
        if names.contains(&name) {
            return refuse(
                s,
                &caller,
                &names,
                format!("{} is given twice", shown_name(&name)),
            )
            .await;
        }
        if names.len() >= MAX_FILES {
            return refuse(s, &caller, &names, format!("more than {MAX_FILES} files")).await;
        }
        let path = incoming.path().join(&name);
        let mut file = tokio::fs::File::create(&path)
            .await
            .map_err(|e| ApiError::from(ReleaseError::Io(format!("{}: {e}", path.display()))))?;
        // A signature is a few hundred bytes: one larger is refused as it arrives, not
        // written whole and then read back.
        let most = if name.ends_with(".minisig") {
            MAX_SIGNATURE_FILE
        } else {
            u64::MAX
        };
        let mut written = 0u64;
        while let Some(chunk) = field.chunk().await.map_err(upload_error)? {
            written += chunk.len() as u64;
            if written > most {
                drop(field);
                drain(&mut multipart).await;
                let why = format!(
                    "{}: a signature of more than {} KiB, which no minisign signature is (a few hundred bytes); give the .minisig that `agent-bundle sign` or `minisign -S` wrote beside its bundle",
                    shown_name(&name),
                    MAX_SIGNATURE_FILE / 1024
                );
                return refuse(s, &caller, &names, why).await;
            }
            file.write_all(&chunk).await.map_err(|e| {
                ApiError::from(ReleaseError::Io(format!("{}: {e}", path.display())))
            })?;
        }
        file.sync_all()
            .await
            .map_err(|e| ApiError::from(ReleaseError::Io(format!("{}: {e}", path.display()))))?;
        names.push(name);
    }
    names.sort();
    // Checked and kept, in the fleet database too; no agent sees it until it is made
    // current (at once, or once another operator approves it).
    let record = match publisher(s).keep_upload(incoming, names.clone()).await {
        Ok(record) => record,
        Err(e) => {
            let e = ApiError::from(e);
            let mut details = json!({ "files": names, "reason": e.message });
            if let Some(name) = &deployment {
                details["deployment"] = json!(name);
            }
            caller.refused(s, "release.publish", details).await;
            return Err(e.audited());
        }
    };
    if let Some(name) = deployment {
        return publish_for_deployment(s, caller, record, names, name).await;
    }
    let act = Act::Release {
        id: record.id.clone(),
        kind: Kind::Publish,
        files: names,
    };
    match actions::perform(s, &caller.actor(), act).await? {
        Done::Release(entry) => {
            Ok((StatusCode::CREATED, Json(entry_json(&entry, true))).into_response())
        }
        Done::Parked(approval) => Ok(super::parked(&approval)),
        _ => Err(super::other_result()),
    }
}

/// `release publish --deployment NAME`: the release is checked and kept as a publish's
/// is, then named for the deployment (an operator action: `deployment.set`, audited, or
/// parked for approval), whose rollout starts; the fleet's current release stays.
async fn publish_for_deployment(
    s: &Shared,
    caller: Caller,
    record: agent_fleet::releases::ReleaseRecord,
    names: Vec<String>,
    deployment: String,
) -> Result<Response, ApiError> {
    caller
        .record(
            s,
            "release.publish",
            json!({ "release": record.id, "files": names, "deployment": deployment }),
        )
        .await;
    // As stored: the signatures are what the fleet holds.
    let record = publisher(s)
        .releases()
        .release(&record.id)
        .await?
        .unwrap_or(record);
    if let Some(approval) = name_for_deployment(s, &caller, &deployment, &record.id).await? {
        return Ok(super::parked(&approval));
    }
    let platforms: Vec<&str> = record.files.iter().map(|f| f.platform.as_str()).collect();
    let (version, build) = record
        .id
        .split_once('+')
        .unwrap_or((record.id.as_str(), ""));
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "id": record.id,
            "version": version,
            "build": build,
            "kind": "publish",
            "deployment": deployment,
            "current": false,
            "platforms": platforms,
            "msi": record.msi,
        })),
    )
        .into_response())
}

/// Names the kept release `id` for `deployment` (an operator action, `deployment.set`,
/// audited): its rollout starts, or, while the fleet requires approval, the change
/// waits for it (the approval is returned).
async fn name_for_deployment(
    s: &Shared,
    caller: &Caller,
    deployment: &str,
    id: &str,
) -> Result<Option<Approval>, ApiError> {
    let act = Act::Deployment(DeploymentAct::Set {
        name: deployment.to_owned(),
        change: agent_fleet::deployments::Change {
            release: Some(id.to_owned()),
            ..Default::default()
        },
    });
    match actions::perform(s, &caller.actor(), act).await? {
        Done::Parked(approval) => Ok(Some(*approval)),
        _ => Ok(None),
    }
}

/// An upload that could not be read: over the limit (which it names), or cut or
/// malformed on the way.
fn upload_error(e: axum::extract::multipart::MultipartError) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the release is refused, nothing changed: the upload is over the limit of {} MiB for one release; publish fewer platforms at once",
                MAX_RELEASE_BODY / (1024 * 1024)
            ),
        );
    }
    ApiError::new(
        e.status(),
        format!(
            "the release is refused, nothing changed: the upload was cut or malformed: {}",
            e.body_text()
        ),
    )
}

/// A file name as a refusal shows it: quoted, control characters escaped, cut.
fn shown_name(name: &str) -> String {
    format!("\"{}\"", agent_protocol::shown::shown(name, 120))
}

/// Reads the rest of an upload refused while it arrives and drops it, so a client still
/// sending reads the answer rather than a broken pipe. Nothing is kept; the upload limit
/// and the request's time bound what is read.
/// (The field being read when it was refused is dropped first: the next one is found by
/// reading past what is left of it.)
async fn drain(multipart: &mut Multipart) {
    while let Ok(Some(mut next)) = multipart.next_field().await {
        while let Ok(Some(_)) = next.chunk().await {}
    }
}

async fn refuse(
    s: &Shared,
    caller: &Caller,
    names: &[String],
    why: String,
) -> Result<Response, ApiError> {
    let why = format!("the release is refused, nothing changed: {why}");
    caller
        .refused(
            s,
            "release.publish",
            json!({ "files": names, "reason": why }),
        )
        .await;
    Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, why).audited())
}

impl From<ReleaseError> for ApiError {
    fn from(e: ReleaseError) -> Self {
        match e {
            ReleaseError::Refused(refused) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, refused.to_string())
            }
            ReleaseError::NoTrust => ApiError::new(StatusCode::CONFLICT, e.to_string()),
            ReleaseError::NotKept(why) => ApiError::new(StatusCode::NOT_FOUND, why),
            ReleaseError::Signatures(why) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, why),
            ReleaseError::Fleet(e) => ApiError::from(e),
            ReleaseError::Io(detail) => {
                tracing::error!("release: {detail}");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the server could not keep the release (its log says why); nothing changed",
                )
            }
        }
    }
}

fn entry_json(entry: &HistoryEntry, current: bool) -> Value {
    let (version, build) = entry
        .release
        .id
        .split_once('+')
        .unwrap_or((entry.release.id.as_str(), ""));
    let platforms: Vec<&str> = entry
        .release
        .files
        .iter()
        .map(|f| f.platform.as_str())
        .collect();
    json!({
        "id": entry.release.id,
        "version": version,
        "build": build,
        "kind": entry.kind.as_str(),
        "published_at": entry.at as f64 / 1000.0,
        "published_by": entry.who,
        "current": current,
        "platforms": platforms,
        "files": entry.release.files,
        "msi": entry.release.msi,
        "identity": entry.release.identity,
    })
}

/// `GET /admin/releases`.
pub(super) async fn list(State(state): State<AppState>, auth: Auth) -> Result<Response, ApiError> {
    let s = &state.inner;
    auth.require(s, Action::Read, "release.read").await?;
    Ok(Json(list_json(s).await?).into_response())
}

/// The history as `/admin/releases` and the page show it.
pub(crate) async fn list_json(s: &Shared) -> Result<Value, ApiError> {
    let history = publisher(s).releases().history(publisher(s).keep()).await?;
    let releases: Vec<Value> = history
        .iter()
        .enumerate()
        .map(|(i, entry)| entry_json(entry, i == 0))
        .collect();
    let serving = match s.store.current() {
        Current::Ready(release) => {
            let identity = release.identity();
            let published = history
                .first()
                .is_some_and(|h| h.release.identity == identity);
            json!({
                "version": release.version().to_string(),
                "identity": identity,
                "platforms": release.platforms(),
                "source": if published { "published" } else { "download-dir" },
            })
        }
        Current::Unavailable(problem) => json!({ "problem": problem.public }),
    };
    Ok(json!({
        "current": releases.first().cloned(),
        "releases": releases,
        "keep": publisher(s).keep(),
        "serving": serving,
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RollbackBody {
    to: String,
    /// The fresh `.minisig` texts, by bundle file name (with or without `.minisig`).
    signatures: BTreeMap<String, String>,
    /// A deployment to move back instead of `default`.
    #[serde(default)]
    deployment: Option<String>,
}

/// `POST /admin/releases/rollback`.
pub(super) async fn rollback(
    State(state): State<AppState>,
    auth: Auth,
    body: Result<Json<RollbackBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let caller = auth.require(s, Action::Change, "release.rollback").await?;
    let body = json_body(body)?;
    let signatures: BTreeMap<String, String> = body
        .signatures
        .into_iter()
        .map(|(name, text)| (name.trim_end_matches(".minisig").to_owned(), text))
        .collect();
    if let Some(name) = body
        .deployment
        .clone()
        .filter(|d| !d.is_empty() && d != agent_fleet::deployments::DEFAULT)
    {
        return rollback_deployment(s, caller, &body.to, signatures, name).await;
    }
    let record = match publisher(s).keep_rollback(&body.to, signatures).await {
        Ok(record) => record,
        Err(e) => {
            let e = ApiError::from(e);
            caller
                .refused(
                    s,
                    "release.rollback",
                    json!({ "release": body.to, "reason": e.message }),
                )
                .await;
            return Err(e.audited());
        }
    };
    let act = Act::Release {
        id: record.id.clone(),
        kind: Kind::Rollback,
        files: record.files.iter().map(|f| f.name.clone()).collect(),
    };
    match actions::perform(s, &caller.actor(), act).await? {
        Done::Release(entry) => Ok(Json(entry_json(&entry, true)).into_response()),
        Done::Parked(approval) => Ok(super::parked(&approval)),
        _ => Err(super::other_result()),
    }
}

/// `release rollback --deployment NAME`: the kept release signed again, newer than what
/// the deployment's agents were last sent, and named for the deployment (its rollout
/// runs at once: a rollback is meant).
async fn rollback_deployment(
    s: &Shared,
    caller: Caller,
    to: &str,
    signatures: BTreeMap<String, String>,
    deployment: String,
) -> Result<Response, ApiError> {
    let (caller, deployment) = (&caller, deployment.as_str());
    let refuse = |why: String| async move {
        caller
            .refused(
                s,
                "release.rollback",
                json!({ "release": to, "deployment": deployment, "reason": why }),
            )
            .await;
        Err::<Response, ApiError>(ApiError::bad_request(why).audited())
    };
    let Some(rollouts) = s.fleet.deployments.rollouts(deployment) else {
        return refuse(format!(
            "no deployment {deployment:?}; list them with `update-server deployment list`"
        ))
        .await;
    };
    // What its agents were last sent: fresh signatures must be newer than that.
    let floor = rollouts.current().map_or(0, |r| r.subject.signed_at);
    let record = match publisher(s)
        .rollback_for_deployment(to, signatures, floor)
        .await
    {
        Ok(record) => record,
        Err(e) => return refuse(ApiError::from(e).message).await,
    };
    caller
        .record(
            s,
            "release.rollback",
            json!({ "release": record.id, "deployment": deployment }),
        )
        .await;
    if let Some(approval) = name_for_deployment(s, caller, deployment, &record.id).await? {
        return Ok(super::parked(&approval));
    }
    Ok(
        Json(json!({ "id": record.id, "deployment": deployment, "kind": "rollback" }))
            .into_response(),
    )
}

/// `GET /admin/releases/{id}/files/{name}`: a kept release's bundle, MSI or signature;
/// `id` may be `current`.
pub(super) async fn file(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    auth.require(s, Action::Read, "release.read").await?;
    let id = if id == "current" {
        match publisher(s).releases().current().await? {
            Some(entry) => entry.release.id,
            None => {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "no release was published yet: publish one with `update-server release publish DIR`",
                ));
            }
        }
    } else {
        id
    };
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("release {id} keeps no file {name}"),
        )
    };
    if check_name(&name).is_err() {
        return Err(not_found());
    }
    let Some(path) = publisher(s).file(&id, &name).await? else {
        return Err(not_found());
    };
    let file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| ApiError::from(ReleaseError::Io(format!("{}: {e}", path.display()))))?;
    let stream = tokio_util::io::ReaderStream::new(file);
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(stream),
    )
        .into_response())
}
