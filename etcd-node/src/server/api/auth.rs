//! Auth: the Auth service (users, roles, permissions, enable/disable, Authenticate) and the
//! checks every other service makes while auth is on.
//!
//! Changes go through Raft ([`crate::mvcc::auth`]); reads of users and roles, and the checks,
//! use this member's applied state. Passwords are hashed with bcrypt (cost 10, as etcd) by
//! the member that takes the request. Tokens are signed, not stored: `<hex user>.<expiry
//! unix seconds>.<HMAC-SHA256>` with the secret chosen when auth was enabled, over the user,
//! the expiry and the user's password hash; so every member checks every token, a token lives
//! 5 minutes from its issue (etcd's default `--auth-token-ttl`, though etcd's simple tokens
//! restart that time on each use; clients authenticate again on `invalid auth token`), and
//! changing a password, deleting the user or disabling auth invalidates it. A stream (Watch,
//! LeaseKeepAlive) is checked when it opens and keeps going past its token's expiry.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::proto::*;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use super::handle::{Api, internal};
use pb::auth_server::Auth as PbAuthService;
use pb::{AuthStatusRequest as PbAuthStatusRequest, AuthStatusResponse as PbAuthStatusResponse};

/// The Auth service's server code (proto/auth.proto).
pub mod pb {
    tonic::include_proto!("etcdserverpb");
}
use crate::errors::EtcdError;
use crate::mvcc::auth::{AuthChange, AuthOp, Perm, ROOT, StoredRole, StoredUser, decode};
use crate::mvcc::auth::{permitted, role_key, user_key};
use crate::mvcc::{Op, Response as Applied};

/// How long a token is valid (etcd's default `--auth-token-ttl`).
const TOKEN_TTL: Duration = Duration::from_secs(300);
/// bcrypt's cost, as etcd's.
const BCRYPT_COST: u32 = 10;

/// What a request needs on a key range (etcd's spelling of ranges).
#[derive(Debug, Clone, Copy)]
pub enum Need<'a> {
    Read(&'a [u8], &'a [u8]),
    Write(&'a [u8], &'a [u8]),
}

/// What a KV request needs (a Txn: its compares and every operation of both branches).
pub fn needs_of(op: &Op) -> Vec<Need<'_>> {
    fn txn<'a>(t: &'a PbTxnRequest, out: &mut Vec<Need<'a>>) {
        for c in &t.compare {
            out.push(Need::Read(&c.key, &c.range_end));
        }
        for o in t.success.iter().chain(&t.failure) {
            match &o.request {
                Some(PbTxnOpRequest::RequestRange(r)) => out.push(Need::Read(&r.key, &r.range_end)),
                Some(PbTxnOpRequest::RequestPut(p)) => put(p, out),
                Some(PbTxnOpRequest::RequestDeleteRange(d)) => delete(d, out),
                Some(PbTxnOpRequest::RequestTxn(t)) => txn(t, out),
                None => {}
            }
        }
    }
    fn put<'a>(p: &'a PbPutRequest, out: &mut Vec<Need<'a>>) {
        out.push(Need::Write(&p.key, &[]));
        if p.prev_kv {
            out.push(Need::Read(&p.key, &[]));
        }
    }
    fn delete<'a>(d: &'a PbDeleteRequest, out: &mut Vec<Need<'a>>) {
        out.push(Need::Write(&d.key, &d.range_end));
        if d.prev_kv {
            out.push(Need::Read(&d.key, &d.range_end));
        }
    }
    let mut out = Vec::new();
    match op {
        Op::Put(p) => put(p, &mut out),
        Op::DeleteRange(d) => delete(d, &mut out),
        Op::Txn(t) => txn(t, &mut out),
        _ => {}
    }
    out
}

/// The leases a KV request attaches keys to (a Put's, and every Put's in a Txn's branches).
pub fn leases_of(op: &Op) -> Vec<i64> {
    fn txn(t: &PbTxnRequest, out: &mut Vec<i64>) {
        for o in t.success.iter().chain(&t.failure) {
            match &o.request {
                Some(PbTxnOpRequest::RequestPut(p)) if p.lease != 0 => out.push(p.lease),
                Some(PbTxnOpRequest::RequestTxn(t)) => txn(t, out),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    match op {
        Op::Put(p) if p.lease != 0 => out.push(p.lease),
        Op::Txn(t) => txn(t, &mut out),
        _ => {}
    }
    out
}

/// An authenticated user's rights.
#[derive(Debug)]
pub struct Rights {
    root: bool,
    perms: Vec<Perm>,
}

fn permission_denied() -> Status {
    EtcdError::PERMISSION_DENIED.into()
}
fn invalid_token() -> Status {
    EtcdError::INVALID_AUTH_TOKEN.into()
}
fn failed_authentication() -> Status {
    EtcdError::AUTH_FAILED.into()
}

/// Who a request comes from, as auth sees it.
#[derive(Debug, Clone)]
pub enum Caller {
    /// The token it carries (etcd's clients send it as `token` metadata).
    Token(String),
    /// With `--client-cert-auth`, the CommonName of its verified client certificate.
    Certificate(String),
}

/// The request's caller: its token or, with none, its client certificate's CommonName (etcd's
/// rule, which lets kube-apiserver use a certificate and no password).
pub fn caller_of<T>(request: &tonic::Request<T>) -> Option<Caller> {
    if let Some(token) = token_of(request.metadata()) {
        return Some(Caller::Token(token));
    }
    let tls = request.extensions().get::<crate::tls::ConnInfo>()?;
    let cn = tls.common_name.as_deref()?;
    Some(Caller::Certificate(cn.to_string()))
}

/// The token a request carries: `token` metadata (etcd's clients), else `authorization` (the
/// JSON gateway's `Authorization` header, which etcd accepts as well).
fn token_of(metadata: &MetadataMap) -> Option<String> {
    metadata
        .get("token")
        .or_else(|| metadata.get("authorization"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn mac(secret: &[u8], user: &str, expiry: u64, password_hash: &str) -> Hmac<Sha256> {
    // (HMAC takes a key of any length)
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(user.as_bytes());
    mac.update(&[0]);
    mac.update(&expiry.to_le_bytes());
    mac.update(password_hash.as_bytes());
    mac
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A new token for `user`.
fn sign(secret: &[u8], user: &StoredUser) -> String {
    let expiry = now_secs() + TOKEN_TTL.as_secs();
    let tag = mac(secret, &user.name, expiry, &user.password_hash)
        .finalize()
        .into_bytes();
    format!(
        "{}.{expiry}.{}",
        hex::encode(user.name.as_bytes()),
        hex::encode(tag)
    )
}

impl Api {
    fn stored<T: prost::Message + Default>(&self, key: &str) -> Result<Option<T>, Status> {
        match self.mvcc.auth_row(key).map_err(Status::from)? {
            Some(bytes) => Ok(Some(
                decode(&bytes).map_err(|e| Status::data_loss(e.to_string()))?,
            )),
            None => Ok(None),
        }
    }

    /// The rights of the token's user; None while auth is off (everything is allowed).
    pub(super) fn rights(&self, token: Option<&Caller>) -> Result<Option<Rights>, Status> {
        if !self.mvcc.auth_enabled() {
            return Ok(None);
        }
        let user = match token {
            None => return Err(EtcdError::USER_EMPTY.into()),
            Some(Caller::Token(token)) => self.verify(token)?.ok_or_else(invalid_token)?,
            // (as etcd: a certificate naming no user may do nothing)
            Some(Caller::Certificate(name)) => self
                .stored::<StoredUser>(&user_key(name))?
                .ok_or_else(permission_denied)?,
        };
        let mut rights = Rights {
            root: user.roles.iter().any(|r| r == ROOT),
            perms: Vec::new(),
        };
        for role in &user.roles {
            if let Some(r) = self.stored::<StoredRole>(&role_key(role))? {
                rights.perms.extend(r.perms);
            }
        }
        Ok(Some(rights))
    }

    /// The user a valid, unexpired token names.
    fn verify(&self, token: &str) -> Result<Option<StoredUser>, Status> {
        let mut parts = token.splitn(3, '.');
        let (Some(user), Some(expiry), Some(tag)) = (parts.next(), parts.next(), parts.next())
        else {
            return Ok(None);
        };
        let (Some(user), Ok(expiry), Some(tag)) = (
            hex::decode(user)
                .ok()
                .and_then(|u| String::from_utf8(u).ok()),
            expiry.parse::<u64>(),
            hex::decode(tag).ok(),
        ) else {
            return Ok(None);
        };
        if expiry <= now_secs() {
            return Ok(None);
        }
        let (Some(secret), Some(stored)) = (
            self.mvcc.auth_row("secret").map_err(Status::from)?,
            self.stored::<StoredUser>(&user_key(&user))?,
        ) else {
            return Ok(None);
        };
        let valid = mac(&secret, &user, expiry, &stored.password_hash)
            .verify_slice(&tag)
            .is_ok();
        Ok(valid.then_some(stored))
    }

    /// Refuses the request unless auth is off or the token's user may do all of `needs`.
    pub(super) fn authorize(
        &self,
        token: Option<&Caller>,
        needs: &[Need<'_>],
    ) -> Result<(), Status> {
        let Some(rights) = self.rights(token)? else {
            return Ok(());
        };
        let allowed = rights.root
            || needs.iter().all(|n| match *n {
                Need::Read(k, e) => permitted(&rights.perms, false, k, e),
                Need::Write(k, e) => permitted(&rights.perms, true, k, e),
            });
        if allowed {
            Ok(())
        } else {
            Err(permission_denied())
        }
    }

    /// Refuses the request unless auth is off or the token's user may read (or, with `write`,
    /// write) every key attached to each of `leases`. As etcd: revoking a lease deletes its
    /// keys, so it needs write access to each; attaching a key to a lease lets its holder
    /// revoke the keys already on it, so that needs the same; listing a lease's keys
    /// (TimeToLive with keys) needs read access to each (etcd's fix for CVE-2023-32082). The
    /// keys checked, for a caller that lists them (never a list read again after the check).
    pub(super) fn authorize_lease_keys(
        &self,
        token: Option<&Caller>,
        leases: &[i64],
        write: bool,
    ) -> Result<Vec<Vec<u8>>, Status> {
        let mut keys = Vec::new();
        for &id in leases {
            if let Some((_, attached)) = self.mvcc.lease(id).map_err(Status::from)? {
                keys.extend(attached);
            }
        }
        let needs: Vec<Need<'_>> = keys
            .iter()
            .map(|k| match write {
                true => Need::Write(k, &[]),
                false => Need::Read(k, &[]),
            })
            .collect();
        self.authorize(token, &needs)?;
        Ok(keys)
    }

    /// A root token this member signs for its own requests to other members (None while auth
    /// is off).
    pub(super) fn member_token(&self) -> Result<Option<String>, Status> {
        if !self.mvcc.auth_enabled() {
            return Ok(None);
        }
        let secret = self.mvcc.auth_row("secret").map_err(Status::from)?;
        let root = self.stored::<StoredUser>(&user_key(ROOT))?;
        Ok(secret.zip(root).map(|(s, u)| sign(&s, &u)))
    }

    /// Refuses the request unless auth is off or the token's user has the root role.
    pub(super) fn require_root(&self, token: Option<&Caller>) -> Result<(), Status> {
        match self.rights(token)? {
            Some(r) if !r.root => Err(permission_denied()),
            _ => Ok(()),
        }
    }

    /// Proposes an auth change (as root, when auth is on).
    async fn change<T>(
        &self,
        token: Option<Caller>,
        op: AuthOp,
        done: impl FnOnce(Option<PbResponseHeader>) -> T,
    ) -> Result<Response<T>, Status> {
        self.require_root(token.as_ref())?;
        let change = AuthChange { op: Some(op) };
        match self.propose(Op::Auth(change)).await? {
            Applied::Auth(header) => Ok(Response::new(done(header))),
            other => Err(internal(format!("unexpected result {other:?}"))),
        }
    }
}

/// bcrypt, off the async threads (it takes tens of milliseconds on purpose).
async fn hash_password(password: String) -> Result<String, Status> {
    if password.is_empty() {
        return Ok(String::new());
    }
    tokio::task::spawn_blocking(move || bcrypt::hash(password, BCRYPT_COST))
        .await
        .map_err(internal)?
        .map_err(internal)
}

/// Auth, over the shared API handle.
#[derive(Debug, Clone)]
pub struct Auth {
    pub api: Api,
}

#[tonic::async_trait]
impl PbAuthService for Auth {
    async fn auth_enable(
        &self,
        request: Request<PbAuthEnableRequest>,
    ) -> Result<Response<PbAuthEnableResponse>, Status> {
        let secret: [u8; 32] = rand::random();
        let token = caller_of(&request);
        self.api
            .change(token, AuthOp::Enable(secret.to_vec()), |header| {
                PbAuthEnableResponse { header }
            })
            .await
    }

    async fn auth_disable(
        &self,
        request: Request<PbAuthDisableRequest>,
    ) -> Result<Response<PbAuthDisableResponse>, Status> {
        let token = caller_of(&request);
        self.api
            .change(token, AuthOp::Disable(true), |header| {
                PbAuthDisableResponse { header }
            })
            .await
    }

    async fn auth_status(
        &self,
        _: Request<PbAuthStatusRequest>,
    ) -> Result<Response<PbAuthStatusResponse>, Status> {
        let revision = self
            .api
            .mvcc
            .auth_row("revision")
            .map_err(Status::from)?
            .and_then(|v| v.try_into().ok().map(u64::from_le_bytes))
            .unwrap_or(0);
        Ok(Response::new(PbAuthStatusResponse {
            header: self.api.current_header(),
            enabled: self.api.mvcc.auth_enabled(),
            auth_revision: revision,
        }))
    }

    /// Checks the password against this member's users after a linearizable barrier (a user
    /// added a moment ago on the other member is known), then signs a token.
    async fn authenticate(
        &self,
        request: Request<PbAuthenticateRequest>,
    ) -> Result<Response<PbAuthenticateResponse>, Status> {
        let req = request.into_inner();
        self.api.barrier().await?;
        if !self.api.mvcc.auth_enabled() {
            return Err(EtcdError::AUTH_NOT_ENABLED.into());
        }
        let user = self
            .api
            .stored::<StoredUser>(&user_key(&req.name))?
            .ok_or_else(failed_authentication)?;
        if user.password_hash.is_empty() {
            return Err(failed_authentication());
        }
        let hash = user.password_hash.clone();
        let matches = tokio::task::spawn_blocking(move || bcrypt::verify(req.password, &hash))
            .await
            .map_err(internal)?
            .unwrap_or(false);
        if !matches {
            return Err(failed_authentication());
        }
        let secret = self
            .api
            .mvcc
            .auth_row("secret")
            .map_err(Status::from)?
            .ok_or_else(|| internal("auth is on but has no token secret"))?;
        Ok(Response::new(PbAuthenticateResponse {
            header: self.api.current_header(),
            token: sign(&secret, &user),
        }))
    }

    async fn user_add(
        &self,
        request: Request<PbAuthUserAddRequest>,
    ) -> Result<Response<PbAuthUserAddResponse>, Status> {
        let token = caller_of(&request);
        self.api.require_root(token.as_ref())?;
        let mut req = request.into_inner();
        let no_password = req.options.as_ref().is_some_and(|o| o.no_password);
        if req.hashed_password.is_empty() && !no_password {
            req.hashed_password = hash_password(std::mem::take(&mut req.password)).await?;
        }
        req.password.clear();
        self.api
            .change(token, AuthOp::UserAdd(req), |header| {
                PbAuthUserAddResponse { header }
            })
            .await
    }

    async fn user_get(
        &self,
        request: Request<PbAuthUserGetRequest>,
    ) -> Result<Response<PbAuthUserGetResponse>, Status> {
        self.api.require_root(caller_of(&request).as_ref())?;
        let name = &request.get_ref().name;
        let user = self
            .api
            .stored::<StoredUser>(&user_key(name))?
            .ok_or_else(|| Status::from(EtcdError::USER_NOT_FOUND))?;
        Ok(Response::new(PbAuthUserGetResponse {
            header: self.api.current_header(),
            roles: user.roles,
        }))
    }

    async fn user_list(
        &self,
        request: Request<PbAuthUserListRequest>,
    ) -> Result<Response<PbAuthUserListResponse>, Status> {
        self.api.require_root(caller_of(&request).as_ref())?;
        Ok(Response::new(PbAuthUserListResponse {
            header: self.api.current_header(),
            users: self.api.names("user/")?,
        }))
    }

    async fn user_delete(
        &self,
        request: Request<PbAuthUserDeleteRequest>,
    ) -> Result<Response<PbAuthUserDeleteResponse>, Status> {
        let token = caller_of(&request);
        let op = AuthOp::UserDelete(request.into_inner());
        self.api
            .change(token, op, |header| PbAuthUserDeleteResponse { header })
            .await
    }

    async fn user_change_password(
        &self,
        request: Request<PbAuthUserChangePasswordRequest>,
    ) -> Result<Response<PbAuthUserChangePasswordResponse>, Status> {
        let token = caller_of(&request);
        self.api.require_root(token.as_ref())?;
        let mut req = request.into_inner();
        if req.hashed_password.is_empty() {
            req.hashed_password = hash_password(std::mem::take(&mut req.password)).await?;
        }
        req.password.clear();
        let op = AuthOp::UserChangePassword(req);
        self.api
            .change(token, op, |header| PbAuthUserChangePasswordResponse {
                header,
            })
            .await
    }

    async fn user_grant_role(
        &self,
        request: Request<PbAuthUserGrantRoleRequest>,
    ) -> Result<Response<PbAuthUserGrantRoleResponse>, Status> {
        let token = caller_of(&request);
        let op = AuthOp::UserGrantRole(request.into_inner());
        self.api
            .change(token, op, |header| PbAuthUserGrantRoleResponse { header })
            .await
    }

    async fn user_revoke_role(
        &self,
        request: Request<PbAuthUserRevokeRoleRequest>,
    ) -> Result<Response<PbAuthUserRevokeRoleResponse>, Status> {
        let token = caller_of(&request);
        let op = AuthOp::UserRevokeRole(request.into_inner());
        self.api
            .change(token, op, |header| PbAuthUserRevokeRoleResponse { header })
            .await
    }

    async fn role_add(
        &self,
        request: Request<PbAuthRoleAddRequest>,
    ) -> Result<Response<PbAuthRoleAddResponse>, Status> {
        let token = caller_of(&request);
        let op = AuthOp::RoleAdd(request.into_inner());
        self.api
            .change(token, op, |header| PbAuthRoleAddResponse { header })
            .await
    }

    async fn role_get(
        &self,
        request: Request<PbAuthRoleGetRequest>,
    ) -> Result<Response<PbAuthRoleGetResponse>, Status> {
        self.api.require_root(caller_of(&request).as_ref())?;
        let name = &request.get_ref().role;
        let role = self
            .api
            .stored::<StoredRole>(&role_key(name))?
            .ok_or_else(|| Status::from(EtcdError::ROLE_NOT_FOUND))?;
        // etcd's Permission has the same fields and numbers as ours.
        let perm = role
            .perms
            .iter()
            .map(|p| prost::Message::decode(prost::Message::encode_to_vec(p).as_slice()))
            .collect::<Result<_, _>>()
            .map_err(internal)?;
        Ok(Response::new(PbAuthRoleGetResponse {
            header: self.api.current_header(),
            perm,
        }))
    }

    async fn role_list(
        &self,
        request: Request<PbAuthRoleListRequest>,
    ) -> Result<Response<PbAuthRoleListResponse>, Status> {
        self.api.require_root(caller_of(&request).as_ref())?;
        Ok(Response::new(PbAuthRoleListResponse {
            header: self.api.current_header(),
            roles: self.api.names("role/")?,
        }))
    }

    async fn role_delete(
        &self,
        request: Request<PbAuthRoleDeleteRequest>,
    ) -> Result<Response<PbAuthRoleDeleteResponse>, Status> {
        let token = caller_of(&request);
        let op = AuthOp::RoleDelete(request.into_inner());
        self.api
            .change(token, op, |header| PbAuthRoleDeleteResponse { header })
            .await
    }

    async fn role_grant_permission(
        &self,
        request: Request<PbAuthRoleGrantPermissionRequest>,
    ) -> Result<Response<PbAuthRoleGrantPermissionResponse>, Status> {
        let token = caller_of(&request);
        let op = AuthOp::RoleGrantPermission(request.into_inner());
        self.api
            .change(token, op, |header| PbAuthRoleGrantPermissionResponse {
                header,
            })
            .await
    }

    async fn role_revoke_permission(
        &self,
        request: Request<PbAuthRoleRevokePermissionRequest>,
    ) -> Result<Response<PbAuthRoleRevokePermissionResponse>, Status> {
        let token = caller_of(&request);
        let op = AuthOp::RoleRevokePermission(request.into_inner());
        self.api
            .change(token, op, |header| PbAuthRoleRevokePermissionResponse {
                header,
            })
            .await
    }
}

impl Api {
    /// The names of the users ("user/") or roles ("role/"), sorted.
    fn names(&self, prefix: &str) -> Result<Vec<String>, Status> {
        Ok(self
            .mvcc
            .auth_rows(prefix)
            .map_err(Status::from)?
            .into_iter()
            .map(|(k, _)| k[prefix.len()..].to_string())
            .collect())
    }
}
