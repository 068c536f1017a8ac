//! `etcdutl cluster reconcile`: brings a running cluster's members and witness to a desired
//! list, one membership change at a time, each printed with why. CKE's member management is the
//! model (remove what is not wanted, add what is missing, re-read the cluster after every step);
//! with a witness the order changes: a cluster of two regular voters plus a witness that loses
//! one voter first keeps one voter and the witness, which cannot take a second failure and
//! refuses a witness without two regular members beside it. So a replacement is added (as a
//! learner) and promoted before the member it replaces is removed, and the witness is moved only
//! while every regular member is healthy.
//!
//! [`plan`] is pure: from the desired list and what was observed, the next step (or that there
//! is none, or that the reconciler waits for something only the operator can do: start a
//! member's process). [`observe`] reads the cluster through its client URLs; [`apply`] takes a
//! step. A member is healthy when its Status answers with no errors but the witness's (the
//! witness's health is the witness step's business here: a lost witness is what moving it fixes).
//!
//! The reconciler never starts or stops processes and never initialises a witness location that
//! holds a witness (`etcdutl witness init` without `--force`).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use witness_core::WitnessUrl;

/// The desired cluster (`--desired <file>`, YAML or JSON).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Desired {
    /// The regular members, each found among the actual ones by its peer URLs.
    pub members: Vec<DesiredMember>,
    /// The witness (none: the cluster should have none).
    #[serde(default)]
    pub witness: Option<DesiredWitness>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct DesiredMember {
    pub name: String,
    pub peer_urls: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesiredWitness {
    pub name: String,
    /// Its `witness:` URL (a blob's with the SAS token: the reconciler may initialise it).
    pub url: String,
}

impl Desired {
    /// Reads and checks a desired file.
    pub fn parse(text: &str, file: &str) -> anyhow::Result<Desired> {
        let d: Desired = serde_norway::from_str(text).with_context(|| {
            format!(
                "--desired {file}: expected `members: [{{name, peer-urls: [...]}}, ...]` and \
                 optionally `witness: {{name, url}}`"
            )
        })?;
        let mut seen = BTreeSet::new();
        for m in &d.members {
            if m.peer_urls.is_empty() {
                bail!("--desired {file}: member {:?} has no peer-urls", m.name);
            }
            for u in &m.peer_urls {
                if WitnessUrl::is_witness(u) {
                    bail!(
                        "--desired {file}: member {:?} has a witness: URL; the witness goes under \
                         `witness:`",
                        m.name
                    );
                }
                if !seen.insert(u.clone()) {
                    bail!("--desired {file}: peer URL {u} is given twice");
                }
            }
        }
        if let Some(w) = &d.witness {
            WitnessUrl::parse(&w.url).with_context(|| format!("--desired {file}: witness url"))?;
            if d.members.len() < 2 {
                bail!(
                    "--desired {file}: a witness needs two regular members beside it ({} given)",
                    d.members.len()
                );
            }
        }
        Ok(d)
    }
}

/// A member as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actual {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
    pub is_witness: bool,
    /// None: healthy; Some(why) otherwise (a witness: always None here).
    pub problem: Option<String>,
    pub is_leader: bool,
}

/// The next thing to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing: the cluster is as desired and every member healthy.
    Converged,
    /// Something only the operator can do (start a process); the reconciler stops here.
    Wait {
        why: String,
    },
    AddLearner {
        name: String,
        peer_urls: Vec<String>,
    },
    Promote {
        id: u64,
        name: String,
    },
    MoveLeader {
        from: u64,
        to: u64,
        to_name: String,
    },
    Remove {
        id: u64,
        name: String,
    },
    RemoveWitness {
        id: u64,
        name: String,
    },
    AddWitness {
        name: String,
        url: String,
    },
}

/// The next step toward `desired` from `actual`, and why.
pub fn plan(desired: &Desired, actual: &[Actual]) -> (Step, String) {
    let wanted = |a: &Actual| {
        desired
            .members
            .iter()
            .any(|d| d.peer_urls.iter().any(|u| a.peer_urls.contains(u)))
    };
    // (a member added through the API has no name until its process announces one: the
    // desired file's name for it, then its id)
    let named: Vec<Actual> = actual
        .iter()
        .map(|a| {
            let mut a = a.clone();
            if a.name.is_empty() {
                a.name = desired
                    .members
                    .iter()
                    .find(|d| d.peer_urls.iter().any(|u| a.peer_urls.contains(u)))
                    .map_or_else(|| format!("{:x}", a.id), |d| d.name.clone());
            }
            a
        })
        .collect();
    let actual = named.as_slice();
    let regular: Vec<&Actual> = actual.iter().filter(|a| !a.is_witness).collect();
    // 1. A desired learner: promoted once healthy (its process started and caught up).
    if let Some(l) = regular.iter().find(|a| a.is_learner && wanted(a)) {
        return match &l.problem {
            None => (
                Step::Promote {
                    id: l.id,
                    name: l.name.clone(),
                },
                format!("{} is a desired member, a learner and healthy", l.name),
            ),
            Some(why) => (
                Step::Wait {
                    why: format!(
                        "learner {} ({:x}) is not healthy yet ({why}): start it with \
                         --initial-cluster-state existing and the peer URLs {}",
                        l.name,
                        l.id,
                        l.peer_urls.join(",")
                    ),
                },
                "a learner is promoted only once it runs and has caught up".into(),
            ),
        };
    }
    // 2. A desired member missing: added as a learner (it does not vote while it catches up, so
    // the quorum does not change until it is promoted).
    if let Some(d) = desired.members.iter().find(|d| {
        !regular
            .iter()
            .any(|a| d.peer_urls.iter().any(|u| a.peer_urls.contains(u)))
    }) {
        return (
            Step::AddLearner {
                name: d.name.clone(),
                peer_urls: d.peer_urls.clone(),
            },
            format!("{} is desired and not a member", d.name),
        );
    }
    // 3. Members not desired, unhealthy ones first; never the leader itself (the lead moves
    // first); only while the desired voters are all healthy (a replacement is in place).
    let mut extra: Vec<&&Actual> = regular.iter().filter(|a| !wanted(a)).collect();
    extra.sort_by_key(|a| a.problem.is_none());
    if let Some(x) = extra.first() {
        let sick: Vec<&str> = regular
            .iter()
            .filter(|a| wanted(a) && a.problem.is_some())
            .map(|a| a.name.as_str())
            .collect();
        if !sick.is_empty() {
            return (
                Step::Wait {
                    why: format!(
                        "{} is to be removed, but desired member(s) {} are not healthy: \
                         removing it now could leave the cluster without a quorum",
                        x.name,
                        sick.join(", ")
                    ),
                },
                "a member is removed only once its replacements are healthy voters".into(),
            );
        }
        if x.is_leader {
            let to = regular
                .iter()
                .find(|a| wanted(a) && !a.is_learner && a.problem.is_none());
            return match to {
                Some(to) => (
                    Step::MoveLeader {
                        from: x.id,
                        to: to.id,
                        to_name: to.name.clone(),
                    },
                    format!("{} leads and is not desired: the lead moves first", x.name),
                ),
                None => (
                    Step::Wait {
                        why: format!("{} leads and no desired voter can take over", x.name),
                    },
                    "the leader is never removed while it leads".into(),
                ),
            };
        }
        let why = match &x.problem {
            Some(p) => format!("{} is not desired and not healthy ({p})", x.name),
            None => format!("{} is not desired", x.name),
        };
        return (
            Step::Remove {
                id: x.id,
                name: x.name.clone(),
            },
            why,
        );
    }
    // 4. The witness, once every regular member is healthy.
    let witness = actual.iter().find(|a| a.is_witness);
    let same = |w: &Actual, d: &DesiredWitness| {
        w.peer_urls
            .first()
            .is_some_and(|u| WitnessUrl::identity(u) == WitnessUrl::identity(&d.url))
    };
    let witness_step = match (witness, &desired.witness) {
        (Some(w), Some(d)) if same(w, d) => None,
        (Some(w), _) => Some((
            Step::RemoveWitness {
                id: w.id,
                name: w.name.clone(),
            },
            match &desired.witness {
                Some(d) => format!(
                    "the witness is to move to {} (one witness per cluster: the old one goes \
                     first)",
                    WitnessUrl::member_list_form(&d.url)
                ),
                None => "no witness is desired".into(),
            },
        )),
        (None, Some(d)) => Some((
            Step::AddWitness {
                name: d.name.clone(),
                url: d.url.clone(),
            },
            "the desired witness is not a member".into(),
        )),
        (None, None) => None,
    };
    if let Some(step) = witness_step {
        if let Some(sick) = regular.iter().find(|a| a.problem.is_some()) {
            return (
                Step::Wait {
                    why: format!(
                        "the witness is to change, but {} is not healthy ({}): without the \
                         witness the other member alone would stop every write",
                        sick.name,
                        sick.problem.as_deref().unwrap_or_default()
                    ),
                },
                "the witness changes only while both regular members are healthy".into(),
            );
        }
        return step;
    }
    if let Some(sick) = regular.iter().find(|a| a.problem.is_some()) {
        return (
            Step::Wait {
                why: format!(
                    "{} is a desired member but not healthy ({}): start it, or list its \
                     replacement in the desired file",
                    sick.name,
                    sick.problem.as_deref().unwrap_or_default()
                ),
            },
            "the members are as desired".into(),
        );
    }
    (
        Step::Converged,
        "the members and the witness are as desired, all healthy".into(),
    )
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Converged => write!(f, "nothing to do"),
            Step::Wait { why } => write!(f, "wait: {why}"),
            Step::AddLearner { name, peer_urls } => write!(
                f,
                "member add {name} --learner --peer-urls={}",
                peer_urls.join(",")
            ),
            Step::Promote { id, name } => write!(f, "member promote {id:x} ({name})"),
            Step::MoveLeader { to, to_name, .. } => write!(f, "move-leader {to:x} ({to_name})"),
            Step::Remove { id, name } => write!(f, "member remove {id:x} ({name})"),
            Step::RemoveWitness { id, name } => {
                write!(f, "member remove {id:x} (the witness {name})")
            }
            Step::AddWitness { name, url } => write!(
                f,
                "witness add {name} {} (initialised first if the location is empty)",
                WitnessUrl::member_list_form(url)
            ),
        }
    }
}

/// How the reconciler reaches the cluster.
pub struct Session {
    pub endpoints: Vec<String>,
    /// (user, password) of a root user, when auth is on.
    pub user: Option<(String, String)>,
}

impl std::fmt::Debug for Session {
    // (never the password)
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("endpoints", &self.endpoints)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .finish()
    }
}

impl Session {
    fn options(&self, timeout: Duration) -> etcd_client::ConnectOptions {
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(timeout);
        match &self.user {
            Some((u, p)) => opts.with_user(u.as_str(), p.as_str()),
            None => opts,
        }
    }

    async fn client(&self, endpoints: &[String]) -> anyhow::Result<etcd_client::Client> {
        etcd_client::Client::connect(endpoints, Some(self.options(Duration::from_secs(30))))
            .await
            .with_context(|| format!("connecting to {}", endpoints.join(",")))
    }

    /// A client of the leader among the endpoints (a change it made is in the member list it
    /// serves at once; another member may not have applied it yet), else of the first that
    /// answers.
    async fn leader_client(&self) -> anyhow::Result<etcd_client::Client> {
        let mut answering = None;
        for ep in &self.endpoints {
            let Ok(mut c) = self.client(std::slice::from_ref(ep)).await else {
                continue;
            };
            let Ok(st) = c.status().await else {
                continue;
            };
            if st.header().is_some_and(|h| h.member_id() == st.leader()) {
                return Ok(c);
            }
            answering.get_or_insert(c);
        }
        answering.with_context(|| format!("no endpoint answers: {}", self.endpoints.join(",")))
    }
}

/// A client call's error as the server's message (which says what to do; the gRPC status code
/// adds nothing for an operator), other errors as they are.
pub fn server_error(e: etcd_client::Error) -> anyhow::Error {
    match e {
        etcd_client::Error::GRpcStatus(s) => anyhow::anyhow!("{}", s.message()),
        e => e.into(),
    }
}

/// Reads the member list and each regular member's Status.
pub async fn observe(s: &Session) -> anyhow::Result<Vec<Actual>> {
    let mut client = s.leader_client().await?;
    let list = client
        .member_list()
        .await
        .map_err(server_error)
        .context("member list")?;
    let mut out = Vec::new();
    for m in list.members() {
        let is_witness = m.peer_urls().iter().any(|u| WitnessUrl::is_witness(u));
        let (problem, is_leader) = if is_witness {
            (None, false)
        } else {
            health(s, m.id(), m.client_urls()).await
        };
        out.push(Actual {
            id: m.id(),
            name: m.name().to_string(),
            peer_urls: m.peer_urls().to_vec(),
            client_urls: m.client_urls().to_vec(),
            is_learner: m.is_learner(),
            is_witness,
            problem,
            is_leader,
        });
    }
    Ok(out)
}

/// (why member `id` is not healthy, None when it is; whether it leads), from its own Status.
async fn health(s: &Session, id: u64, client_urls: &[String]) -> (Option<String>, bool) {
    if client_urls.is_empty() {
        return (Some("no client URL known: not started".into()), false);
    }
    let connect =
        etcd_client::Client::connect(client_urls, Some(s.options(Duration::from_secs(3))));
    let status = match connect.await {
        Ok(mut c) => c.status().await,
        Err(e) => Err(e),
    };
    match status {
        Err(e) => (Some(format!("unreachable: {}", server_error(e))), false),
        Ok(st) => {
            let errors: Vec<&String> = st
                .errors()
                .iter()
                .filter(|e| !e.contains("witness unavailable"))
                .collect();
            let leads = st.leader() == id;
            if errors.is_empty() {
                (None, leads)
            } else {
                let joined: Vec<&str> = errors.iter().map(|e| e.as_str()).collect();
                (Some(format!("Status errors: {}", joined.join("; "))), leads)
            }
        }
    }
}

/// Takes `step`; a promotion refused because the learner is not in sync yet is retried for up to
/// `wait`.
pub async fn apply(
    s: &Session,
    step: &Step,
    actual: &[Actual],
    wait: Duration,
) -> anyhow::Result<()> {
    let mut client = s.client(&s.endpoints).await?;
    match step {
        Step::Converged | Step::Wait { .. } => {}
        Step::AddLearner { peer_urls, .. } => {
            let opts = etcd_client::MemberAddOptions::new().with_is_learner();
            client
                .cluster_client()
                .member_add(peer_urls.clone(), Some(opts))
                .await
                .map_err(server_error)?;
        }
        Step::Promote { id, .. } => {
            let started = std::time::Instant::now();
            loop {
                match client.member_promote(*id).await.map_err(server_error) {
                    Ok(_) => break,
                    Err(e) if e.to_string().contains("in sync") && started.elapsed() < wait => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Step::MoveLeader { from, to, .. } => {
            let leader = actual
                .iter()
                .find(|a| a.id == *from)
                .map(|a| a.client_urls.clone())
                .unwrap_or_default();
            let mut at_leader = s.client(&leader).await?;
            at_leader.move_leader(*to).await.map_err(server_error)?;
        }
        Step::Remove { id, .. } | Step::RemoveWitness { id, .. } => {
            client.member_remove(*id).await.map_err(server_error)?;
        }
        Step::AddWitness { name, url } => {
            let parsed = WitnessUrl::parse(url)?;
            // An empty location is initialised; one that holds a witness is left as it is (the
            // cluster then refuses it if another cluster used it): never --force.
            let held = crate::witness::open_store(&parsed)?
                .load()
                .await
                .with_context(|| format!("reading the witness location {parsed}"))?;
            if held.is_none() {
                crate::witness::init(&crate::witness::InitOptions {
                    name: name.clone(),
                    url: parsed,
                    force: false,
                })
                .await
                .with_context(|| format!("initialising the witness {name}"))?;
            }
            client
                .cluster_client()
                .member_add(vec![url.clone()], None)
                .await
                .map_err(server_error)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desired(members: &[(&str, &str)], witness: Option<&str>) -> Desired {
        Desired {
            members: members
                .iter()
                .map(|(n, u)| DesiredMember {
                    name: n.to_string(),
                    peer_urls: vec![u.to_string()],
                })
                .collect(),
            witness: witness.map(|u| DesiredWitness {
                name: "w".into(),
                url: u.into(),
            }),
        }
    }

    fn member(id: u64, name: &str, url: &str) -> Actual {
        Actual {
            id,
            name: name.into(),
            peer_urls: vec![url.into()],
            client_urls: vec![format!("{url}0")],
            is_learner: false,
            is_witness: url.starts_with("witness:"),
            problem: None,
            is_leader: false,
        }
    }

    const W1: &str = "witness:mount?path=%2Fw1";
    const W2: &str = "witness:mount?path=%2Fw2";

    #[test]
    fn a_healthy_cluster_as_desired_is_left_alone() {
        let d = desired(&[("a", "http://a"), ("b", "http://b")], Some(W1));
        let mut a = vec![
            member(1, "a", "http://a"),
            member(2, "b", "http://b"),
            member(3, "w", W1),
        ];
        a[0].is_leader = true;
        assert_eq!(plan(&d, &a).0, Step::Converged);
    }

    #[test]
    fn a_dead_member_is_replaced_before_it_is_removed() {
        let d = desired(&[("a", "http://a"), ("c", "http://c")], Some(W1));
        let mut a = vec![
            member(1, "a", "http://a"),
            member(2, "b", "http://b"),
            member(3, "w", W1),
        ];
        a[1].problem = Some("unreachable".into());
        // First the replacement, as a learner; the dead member stays meanwhile.
        assert!(matches!(plan(&d, &a).0, Step::AddLearner { ref name, .. } if name == "c"));
        let mut c = member(4, "c", "http://c");
        c.is_learner = true;
        c.problem = Some("no client URL known: not started".into());
        a.push(c);
        assert!(
            matches!(plan(&d, &a).0, Step::Wait { .. }),
            "the operator starts c"
        );
        a[3].problem = None;
        assert_eq!(
            plan(&d, &a).0,
            Step::Promote {
                id: 4,
                name: "c".into()
            }
        );
        a[3].is_learner = false;
        assert_eq!(
            plan(&d, &a).0,
            Step::Remove {
                id: 2,
                name: "b".into()
            }
        );
        a.remove(1);
        assert_eq!(plan(&d, &a).0, Step::Converged);
    }

    #[test]
    fn a_member_is_not_removed_while_a_desired_one_is_sick_nor_while_it_leads() {
        let d = desired(&[("a", "http://a"), ("b", "http://b")], Some(W1));
        let mut a = vec![
            member(1, "a", "http://a"),
            member(2, "b", "http://b"),
            member(3, "w", W1),
            member(4, "x", "http://x"),
        ];
        a[1].problem = Some("unreachable".into());
        assert!(matches!(plan(&d, &a).0, Step::Wait { .. }));
        a[1].problem = None;
        a[3].is_leader = true;
        assert!(matches!(
            plan(&d, &a).0,
            Step::MoveLeader { from: 4, to: 1, .. }
        ));
        a[3].is_leader = false;
        assert_eq!(
            plan(&d, &a).0,
            Step::Remove {
                id: 4,
                name: "x".into()
            }
        );
    }

    #[test]
    fn the_witness_moves_only_while_both_members_are_healthy() {
        let d = desired(&[("a", "http://a"), ("b", "http://b")], Some(W2));
        let mut a = vec![
            member(1, "a", "http://a"),
            member(2, "b", "http://b"),
            member(3, "w", W1),
        ];
        a[1].problem = Some("unreachable".into());
        assert!(matches!(plan(&d, &a).0, Step::Wait { .. }));
        a[1].problem = None;
        assert_eq!(
            plan(&d, &a).0,
            Step::RemoveWitness {
                id: 3,
                name: "w".into()
            }
        );
        a.remove(2);
        assert!(matches!(plan(&d, &a).0, Step::AddWitness { ref url, .. } if url == W2));
    }

    #[test]
    fn desired_files_are_checked_with_messages() {
        let ok = "members:\n  - name: a\n    peer-urls: [http://a:2380]\n  - name: b\n    peer-urls: [http://b:2380]\nwitness:\n  name: w\n  url: witness:mount?path=%2Fw\n";
        let d = Desired::parse(ok, "f").unwrap();
        assert_eq!(d.members.len(), 2);
        let json = r#"{"members": [{"name": "a", "peer-urls": ["http://a:2380"]}]}"#;
        assert!(Desired::parse(json, "f").unwrap().witness.is_none());
        let one = "members:\n  - name: a\n    peer-urls: [http://a]\nwitness: {name: w, url: \"witness:mount?path=%2Fw\"}\n";
        assert!(format!("{:#}", Desired::parse(one, "f").unwrap_err()).contains("two regular"));
        let twice = "members:\n  - {name: a, peer-urls: [http://a]}\n  - {name: b, peer-urls: [http://a]}\n";
        assert!(format!("{:#}", Desired::parse(twice, "f").unwrap_err()).contains("twice"));
        let typo = "member:\n  - {name: a, peer-urls: [http://a]}\n";
        assert!(format!("{:#}", Desired::parse(typo, "f").unwrap_err()).contains("members:"));
        let bad = "members:\n  - {name: a, peer-urls: [http://a]}\n  - {name: b, peer-urls: [http://b]}\nwitness: {name: w, url: \"witness:nope\"}\n";
        assert!(Desired::parse(bad, "f").is_err());
    }
}
