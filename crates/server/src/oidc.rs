//! Single sign-on with OpenID Connect: the authorization code flow with PKCE and a nonce, on the
//! `openidconnect` crate. This module speaks the protocol (discovery, the authorization URL, the
//! code exchange, verifying the ID token's signature, issuer, audience, expiry and nonce, the
//! userinfo claims, RP-initiated logout) and turns the identity provider's groups into Trainyard
//! roles through the operator's mapping; the application (`app/sso.rs`) keeps the records.
//!
//! - Claims are read from the ID token and, when the provider has a userinfo endpoint, from
//!   userinfo too (OIDC Core 5.4 lets a provider release scope claims there only); userinfo's
//!   `sub` must be the ID token's. Groups are the union of both, names the ID token's first.
//! - ID tokens may be signed with any algorithm the provider's discovery lists (RS256, ES256,
//!   EdDSA with Ed25519, ...) except `none`; times are checked with [`CLOCK_LEEWAY`].
//!
//! - The provider's metadata and signing keys are discovered once and kept for
//!   [`METADATA_MAX_AGE`]; an ID token signed with a key not among them makes one fresh discovery
//!   before it is refused, so a provider that rotates its keys is followed at once.
//! - The HTTP client follows no redirects (a redirect from the provider would let it point the
//!   server at any address, a server-side request forgery).

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use clap::Args;
use openidconnect::core::{
    CoreAuthPrompt, CoreAuthenticationFlow, CoreClient, CoreGenderClaim, CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
};
use openidconnect::{
    AdditionalClaims, AuthorizationCode, ClaimsVerificationError, ClientId, ClientSecret, CsrfToken, IdToken,
    IdTokenVerifier, IssuerUrl, LogoutRequest, Nonce, PkceCodeChallenge, PkceCodeVerifier, PostLogoutRedirectUrl,
    ProviderMetadataWithLogout, RedirectUrl, RequestTokenError, Scope, SignatureVerificationError, UserInfoClaims,
    UserInfoError,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use trainyard_core::auth::Role;
use trainyard_core::names::TenantName;
use trainyard_core::{Error, Result};

/// How long discovered provider metadata and keys are trusted before they are fetched again.
pub const METADATA_MAX_AGE: Duration = Duration::from_secs(15 * 60);

/// The longest the server waits for the identity provider on one request.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(10);

/// How far the provider's clock may be ahead of or behind ours on an ID token's times.
pub const CLOCK_LEEWAY: Duration = Duration::from_secs(60);

/// Command-line settings of single sign-on (`trainyard serve` and `trainyard dev`).
#[derive(Args, Debug, Clone, Default)]
pub struct OidcArgs {
    /// The OpenID Connect issuer URL of the identity provider (its discovery document is
    /// `<issuer>/.well-known/openid-configuration`). Turns single sign-on on.
    #[arg(long, env = "TRAINYARD_OIDC_ISSUER")]
    pub oidc_issuer: Option<String>,
    /// This server's client id at the identity provider.
    #[arg(long, env = "TRAINYARD_OIDC_CLIENT_ID", requires = "oidc_issuer")]
    pub oidc_client_id: Option<String>,
    /// A file holding the client secret (none for a public client, which PKCE protects). Never
    /// on the command line, where every process on the machine could read it.
    #[arg(long, env = "TRAINYARD_OIDC_CLIENT_SECRET_FILE", requires = "oidc_issuer")]
    pub oidc_client_secret_file: Option<std::path::PathBuf>,
    /// Where the provider sends browsers back: `<public URL of the dashboard>/sso/callback`
    /// (default: the listening address).
    #[arg(long, env = "TRAINYARD_OIDC_REDIRECT_URL", requires = "oidc_issuer")]
    pub oidc_redirect_url: Option<String>,
    /// The ID token (or userinfo) claim that lists the user's groups.
    #[arg(long, default_value = "groups")]
    pub oidc_groups_claim: String,
    /// The scopes asked of the provider, separated by spaces or commas (`openid` is always
    /// asked). Add `groups` for providers that send groups only for it (Dex, Okta).
    #[arg(long, env = "TRAINYARD_OIDC_SCOPES", default_value = "openid profile email")]
    pub oidc_scopes: String,
    /// A group's role in a tenant, as GROUP=TENANT:ROLE (ROLE: viewer, member or admin);
    /// repeat it for more. A user in none of the mapped groups is refused.
    #[arg(long = "oidc-group-role", value_name = "GROUP=TENANT:ROLE", value_parser = GroupRole::parse)]
    pub oidc_group_roles: Vec<GroupRole>,
    /// Members of this group are platform admins (and others are not, among users who sign in
    /// with single sign-on).
    #[arg(long, requires = "oidc_issuer")]
    pub oidc_admin_group: Option<String>,
    /// Create a Trainyard user at the first sign-in of an identity the server has not seen.
    #[arg(long, requires = "oidc_issuer")]
    pub oidc_provision_users: bool,
    /// The provider's name on the sign-in page.
    #[arg(long, default_value = "single sign-on")]
    pub oidc_display_name: String,
}

/// One line of the group mapping: members of `group` get `role` in `tenant`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRole {
    pub group: String,
    pub tenant: TenantName,
    pub role: Role,
}

impl GroupRole {
    /// Parses `GROUP=TENANT:ROLE`.
    pub fn parse(text: &str) -> std::result::Result<GroupRole, String> {
        let usage = || format!("{text:?} is not GROUP=TENANT:ROLE (for example ml-team=vision:member)");
        let (group, grant) = text.rsplit_once('=').ok_or_else(usage)?;
        let (tenant, role) = grant.split_once(':').ok_or_else(usage)?;
        if group.is_empty() {
            return Err(usage());
        }
        let role = Role::parse(role).ok_or_else(|| format!("{role:?} is not a role: viewer, member or admin"))?;
        Ok(GroupRole { group: group.to_string(), tenant: TenantName::parse(tenant)?, role })
    }
}

/// What the groups of an identity grant, by the operator's mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    /// A role per tenant: the highest any of the user's groups gives there.
    pub roles: BTreeMap<String, Role>,
    /// The platform-admin flag, when the operator maps a group to it.
    pub platform_admin: Option<bool>,
}

impl Grants {
    /// Whether the groups grant anything at all (a user they grant nothing is refused).
    pub fn any(&self) -> bool {
        !self.roles.is_empty() || self.platform_admin == Some(true)
    }
}

/// The roles `groups` give under `mapping`, and the platform-admin flag under `admin_group`.
pub fn grants(mapping: &[GroupRole], admin_group: Option<&str>, groups: &[String]) -> Grants {
    let mut roles = BTreeMap::new();
    for line in mapping.iter().filter(|line| groups.contains(&line.group)) {
        let role = roles.entry(line.tenant.as_str().to_string()).or_insert(line.role);
        *role = (*role).max(line.role);
    }
    let platform_admin = admin_group.map(|group| groups.iter().any(|g| g == group));
    Grants { roles, platform_admin }
}

/// Claims beyond the standard ones, kept whole so that the operator can name the groups claim.
#[derive(Debug, Clone, Deserialize, Serialize)]
struct OtherClaims {
    #[serde(flatten)]
    claims: serde_json::Map<String, serde_json::Value>,
}
impl AdditionalClaims for OtherClaims {}

type GroupsIdToken = IdToken<OtherClaims, CoreGenderClaim, CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm>;

/// The groups in a claim's value: a list of strings, or one string.
pub fn groups_of(value: Option<&serde_json::Value>) -> Vec<String> {
    match value {
        Some(serde_json::Value::Array(items)) => items.iter().filter_map(|g| g.as_str().map(str::to_string)).collect(),
        Some(serde_json::Value::String(group)) => vec![group.clone()],
        _ => Vec::new(),
    }
}

/// Where to send the browser, and what to keep until it comes back.
pub struct Authorization {
    pub url: String,
    pub state: String,
    pub pkce_verifier: String,
    pub nonce: String,
}

/// Who signed in, as the verified ID token (and userinfo) say.
#[derive(Clone)]
pub struct Identity {
    pub issuer: String,
    pub subject: String,
    /// `preferred_username`, else a verified `email`: the name a new user gets (after
    /// [`user_name_for`]).
    pub name_hint: Option<String>,
    pub groups: Vec<String>,
    /// Whether the groups claim was there at all (absent: the scopes may not ask for it).
    pub groups_claim_sent: bool,
    /// The ID token as received, the `id_token_hint` of an RP-initiated logout.
    pub id_token: String,
}

/// The claims of one source (the ID token or userinfo) that an identity is made of.
#[derive(Default)]
struct Claimed {
    preferred_username: Option<String>,
    email: Option<String>,
    email_verified: Option<bool>,
    groups: Option<Vec<String>>,
}

impl Claimed {
    fn new(
        preferred_username: Option<String>,
        email: Option<String>,
        email_verified: Option<bool>,
        others: &OtherClaims,
        groups_claim: &str,
    ) -> Claimed {
        let groups = others.claims.get(groups_claim).map(|value| groups_of(Some(value)));
        Claimed { preferred_username, email, email_verified, groups }
    }
}

/// The name hint from the ID token's claims and userinfo's: `preferred_username` from either,
/// else an e-mail address the provider says it verified (an unverified one may be anybody's).
fn name_hint_of(id_token: &Claimed, userinfo: &Claimed) -> Option<String> {
    let verified_email = |claimed: &Claimed| claimed.email.clone().filter(|_| claimed.email_verified == Some(true));
    id_token
        .preferred_username
        .clone()
        .or_else(|| userinfo.preferred_username.clone())
        .or_else(|| verified_email(id_token))
        .or_else(|| verified_email(userinfo))
}

/// The groups from the ID token and userinfo together, and whether either sent the claim.
fn groups_merged(id_token: &Claimed, userinfo: &Claimed) -> (Vec<String>, bool) {
    let sent = id_token.groups.is_some() || userinfo.groups.is_some();
    let mut groups: Vec<String> = id_token.groups.iter().chain(userinfo.groups.iter()).flatten().cloned().collect();
    groups.sort();
    groups.dedup();
    (groups, sent)
}

/// The scopes in `text` (spaces or commas between them), `openid` left out: the crate always
/// asks for it.
pub fn scopes_of(text: &str) -> Vec<String> {
    let mut scopes: Vec<String> = Vec::new();
    for scope in text.split([' ', ',']).filter(|s| !s.is_empty() && *s != "openid") {
        if !scopes.iter().any(|s| s == scope) {
            scopes.push(scope.to_string());
        }
    }
    scopes
}

/// A user name for a new user from what the provider calls them: the characters a user name
/// allows, at most 128, starting with a letter or digit; `sso-` and part of the subject when
/// nothing usable is left.
pub fn user_name_for(name_hint: Option<&str>, subject: &str) -> String {
    let cleaned: String = name_hint
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '-'))
        .skip_while(|c| !c.is_ascii_alphanumeric())
        .take(128)
        .collect();
    if cleaned.is_empty() {
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(subject.as_bytes()));
        format!("sso-{}", &digest[..12])
    } else {
        cleaned
    }
}

/// The identity provider this server signs people in with.
pub struct Oidc {
    issuer: IssuerUrl,
    client_id: ClientId,
    client_secret: Option<ClientSecret>,
    /// Set from the settings, or from the listening address when the server starts.
    redirect_url: OnceLock<RedirectUrl>,
    pub groups_claim: String,
    scopes: Vec<String>,
    pub group_roles: Vec<GroupRole>,
    pub admin_group: Option<String>,
    pub provision_users: bool,
    pub display_name: String,
    http: reqwest::Client,
    /// The discovered metadata (with the signing keys) and when it was fetched.
    provider: Mutex<Option<(ProviderMetadataWithLogout, Instant)>>,
}

impl Oidc {
    /// Single sign-on as the settings describe it, or `None` when it is off.
    pub fn from_args(args: &OidcArgs) -> anyhow::Result<Option<Oidc>> {
        let Some(issuer) = &args.oidc_issuer else { return Ok(None) };
        let issuer = IssuerUrl::new(issuer.clone()).map_err(|err| anyhow::anyhow!("--oidc-issuer: {err}"))?;
        let client_id = args
            .oidc_client_id
            .clone()
            .ok_or_else(|| anyhow::anyhow!("--oidc-client-id is needed with --oidc-issuer"))?;
        let client_secret = match &args.oidc_client_secret_file {
            Some(path) => {
                let secret = std::fs::read_to_string(path)
                    .map_err(|err| anyhow::anyhow!("reading --oidc-client-secret-file {}: {err}", path.display()))?;
                Some(ClientSecret::new(secret.trim().to_string()))
            }
            None => None,
        };
        if args.oidc_group_roles.is_empty() && args.oidc_admin_group.is_none() {
            anyhow::bail!(
                "single sign-on needs at least one --oidc-group-role (or --oidc-admin-group): nobody could sign in"
            );
        }
        let redirect_url = OnceLock::new();
        if let Some(url) = &args.oidc_redirect_url {
            let url = RedirectUrl::new(url.clone()).map_err(|err| anyhow::anyhow!("--oidc-redirect-url: {err}"))?;
            let _ = redirect_url.set(url);
        }
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(PROVIDER_TIMEOUT)
            .build()
            .map_err(|err| anyhow::anyhow!("the HTTP client for single sign-on: {err}"))?;
        Ok(Some(Oidc {
            issuer,
            client_id: ClientId::new(client_id),
            client_secret,
            redirect_url,
            groups_claim: args.oidc_groups_claim.clone(),
            scopes: scopes_of(&args.oidc_scopes),
            group_roles: args.oidc_group_roles.clone(),
            admin_group: args.oidc_admin_group.clone(),
            provision_users: args.oidc_provision_users,
            display_name: args.oidc_display_name.clone(),
            http,
            provider: Mutex::new(None),
        }))
    }

    /// The callback URL for a server listening at `base` (`http://host:port`), unless the
    /// settings named one.
    pub fn redirect_url_default(&self, base: &str) {
        if let Ok(url) = RedirectUrl::new(format!("{base}/sso/callback")) {
            let _ = self.redirect_url.set(url);
        }
    }

    pub fn issuer(&self) -> &str {
        self.issuer.as_str()
    }

    /// Every tenant the mapping names (memberships there follow the groups).
    pub fn mapped_tenants(&self) -> Vec<String> {
        let mut tenants: Vec<String> = self.group_roles.iter().map(|line| line.tenant.to_string()).collect();
        tenants.sort();
        tenants.dedup();
        tenants
    }

    /// The provider's metadata: the kept one while fresh (unless `refresh`), else discovered.
    async fn metadata(&self, refresh: bool) -> Result<ProviderMetadataWithLogout> {
        let mut kept = self.provider.lock().await;
        if let Some((metadata, fetched)) = kept.as_ref()
            && !refresh
            && fetched.elapsed() < METADATA_MAX_AGE
        {
            return Ok(metadata.clone());
        }
        let metadata =
            ProviderMetadataWithLogout::discover_async(self.issuer.clone(), &self.http).await.map_err(|err| {
                Error::Unavailable(format!(
                    "the identity provider {} could not be reached: {}",
                    self.issuer.as_str(),
                    chain(err)
                ))
            })?;
        *kept = Some((metadata.clone(), Instant::now()));
        Ok(metadata)
    }

    fn client(
        &self,
        metadata: ProviderMetadataWithLogout,
    ) -> Result<
        CoreClient<
            openidconnect::EndpointSet,
            openidconnect::EndpointNotSet,
            openidconnect::EndpointNotSet,
            openidconnect::EndpointNotSet,
            openidconnect::EndpointMaybeSet,
            openidconnect::EndpointMaybeSet,
        >,
    > {
        let redirect = self
            .redirect_url
            .get()
            .cloned()
            .ok_or_else(|| Error::internal("single sign-on has no callback URL yet"))?;
        Ok(CoreClient::from_provider_metadata(metadata, self.client_id.clone(), self.client_secret.clone())
            .set_redirect_uri(redirect))
    }

    /// Starts a sign-in: the provider's authorization URL with a fresh state, PKCE challenge
    /// (S256), nonce and the configured scopes; with `prompt=login` when `sign_in_again` (the
    /// browser signed out, and the provider must not sign the next person in as the last).
    pub async fn authorization(&self, sign_in_again: bool) -> Result<Authorization> {
        let client = self.client(self.metadata(false).await?)?;
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut request = client
            .authorize_url(CoreAuthenticationFlow::AuthorizationCode, CsrfToken::new_random, Nonce::new_random)
            .add_scopes(self.scopes.iter().cloned().map(Scope::new))
            .set_pkce_challenge(challenge);
        if sign_in_again {
            request = request.add_prompt(CoreAuthPrompt::Login);
        }
        let (url, state, nonce) = request.url();
        Ok(Authorization {
            url: url.to_string(),
            state: state.secret().clone(),
            pkce_verifier: verifier.secret().clone(),
            nonce: nonce.secret().clone(),
        })
    }

    /// The ID token verifier: the algorithms the provider lists (never `none`), times with
    /// [`CLOCK_LEEWAY`] either way.
    fn verifier<'a>(
        metadata: &ProviderMetadataWithLogout,
        verifier: IdTokenVerifier<'a, openidconnect::core::CoreJsonWebKey>,
    ) -> IdTokenVerifier<'a, openidconnect::core::CoreJsonWebKey> {
        let leeway = chrono::Duration::from_std(CLOCK_LEEWAY).unwrap_or_default();
        let algorithms: Vec<CoreJwsSigningAlgorithm> = metadata
            .id_token_signing_alg_values_supported()
            .iter()
            .filter(|alg| **alg != CoreJwsSigningAlgorithm::None)
            .cloned()
            .collect();
        verifier
            .set_allowed_algs(algorithms)
            // Expiry is checked against this time: a token is accepted up to the leeway after it.
            .set_time_fn(move || chrono::Utc::now() - leeway)
            .set_issue_time_verifier_fn(move |issued| {
                if issued > chrono::Utc::now() + leeway {
                    Err(format!("it was issued at {issued}, in the future (is the provider's clock right?)"))
                } else {
                    Ok(())
                }
            })
    }

    /// Finishes a sign-in: exchanges the code (with the PKCE verifier), verifies the ID token
    /// against the nonce and reads userinfo when the provider has it. Anything that does not
    /// verify is `Unauthenticated`, saying what did not.
    pub async fn identity(&self, code: &str, pkce_verifier: &str, nonce: &str) -> Result<Identity> {
        let refused = |what: String| Error::Unauthenticated(format!("single sign-on failed: {what}"));
        let metadata = self.metadata(false).await?;
        let client = self.client(metadata.clone())?;
        let response = client
            .exchange_code(AuthorizationCode::new(code.to_string()))
            .map_err(|err| Error::internal(format!("the identity provider has no token endpoint: {err}")))?
            .set_pkce_verifier(PkceCodeVerifier::new(pkce_verifier.to_string()))
            .request_async(&self.http)
            .await
            .map_err(|err| match err {
                RequestTokenError::ServerResponse(answer) => {
                    refused(format!("the identity provider refused the code: {answer}"))
                }
                RequestTokenError::Request(err) => Error::Unavailable(format!(
                    "the identity provider {} could not be reached for the token: {}",
                    self.issuer.as_str(),
                    chain(err)
                )),
                RequestTokenError::Parse(err, _) => {
                    refused(format!("the identity provider's token response could not be read: {}", chain(err)))
                }
                RequestTokenError::Other(what) => refused(format!("the token request failed: {what}")),
            })?;
        let raw = openidconnect::TokenResponse::id_token(&response)
            .ok_or_else(|| refused("the identity provider returned no ID token".into()))?
            .to_string();
        let id_token: GroupsIdToken =
            raw.parse().map_err(|err| refused(format!("the ID token is malformed: {err}")))?;
        let nonce = Nonce::new(nonce.to_string());
        let first = id_token.claims(&Self::verifier(&metadata, client.id_token_verifier()), &nonce).cloned();
        let (claims, client) = match first {
            Ok(claims) => (claims, client),
            Err(ClaimsVerificationError::SignatureVerification(SignatureVerificationError::NoMatchingKey)) => {
                // Signed with a key we have not seen: the provider may have rotated its keys.
                let metadata = self.metadata(true).await?;
                let client = self.client(metadata.clone())?;
                let claims = id_token
                    .claims(&Self::verifier(&metadata, client.id_token_verifier()), &nonce)
                    .map_err(|err| refused(format!("the ID token did not verify: {}", chain(err))))?
                    .clone();
                (claims, client)
            }
            Err(err) => return Err(refused(format!("the ID token did not verify: {}", chain(err)))),
        };
        let from_id_token = Claimed::new(
            claims.preferred_username().map(|name| name.as_str().to_string()),
            claims.email().map(|email| email.as_str().to_string()),
            claims.email_verified(),
            claims.additional_claims(),
            &self.groups_claim,
        );
        let from_userinfo = match client.user_info(
            openidconnect::OAuth2TokenResponse::access_token(&response).clone(),
            Some(claims.subject().clone()),
        ) {
            // No userinfo endpoint: the ID token is all there is.
            Err(_) => Claimed::default(),
            Ok(request) => {
                let userinfo: UserInfoClaims<OtherClaims, CoreGenderClaim> =
                    request.request_async(&self.http).await.map_err(|err| match err {
                        UserInfoError::ClaimsVerification(ClaimsVerificationError::InvalidSubject(what)) => {
                            refused(format!("userinfo names another subject than the ID token: {what}"))
                        }
                        UserInfoError::Request(err) => Error::Unavailable(format!(
                            "the identity provider's userinfo endpoint could not be reached: {}",
                            chain(err)
                        )),
                        other => {
                            refused(format!("the identity provider's userinfo answer was refused: {}", chain(other)))
                        }
                    })?;
                Claimed::new(
                    userinfo.preferred_username().map(|name| name.as_str().to_string()),
                    userinfo.email().map(|email| email.as_str().to_string()),
                    userinfo.email_verified(),
                    userinfo.additional_claims(),
                    &self.groups_claim,
                )
            }
        };
        let (groups, groups_claim_sent) = groups_merged(&from_id_token, &from_userinfo);
        Ok(Identity {
            issuer: claims.issuer().as_str().to_string(),
            subject: claims.subject().as_str().to_string(),
            name_hint: name_hint_of(&from_id_token, &from_userinfo),
            groups,
            groups_claim_sent,
            id_token: raw,
        })
    }

    /// Where to send a browser that signs out (RP-initiated logout): the provider's
    /// `end_session_endpoint` with the session's ID token as `id_token_hint` and
    /// this server's sign-in page to come back to (`post_logout_redirect_uri`, the callback's
    /// `../login`); `None` when the provider has no such endpoint.
    pub async fn logout_url(&self, id_token_hint: Option<&str>) -> Option<String> {
        let metadata = self.metadata(false).await.ok()?;
        let endpoint = metadata.additional_metadata().end_session_endpoint.clone()?;
        let mut request = LogoutRequest::from(endpoint).set_client_id(self.client_id.clone());
        if let Some(hint) = id_token_hint.and_then(|raw| raw.parse::<GroupsIdToken>().ok()) {
            request = request.set_id_token_hint(&hint);
        }
        if let Some(back) = self.redirect_url.get().and_then(|callback| callback.url().join("../login").ok()) {
            request = request.set_post_logout_redirect_uri(PostLogoutRedirectUrl::from_url(back));
        }
        Some(request.http_get_url().to_string())
    }
}

/// An error with its causes, for a message a person can act on (anyhow's alternate form).
fn chain(err: impl std::error::Error + Send + Sync + 'static) -> String {
    format!("{:#}", anyhow::Error::new(err))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> GroupRole {
        GroupRole::parse(text).unwrap_or_else(|err| panic!("{err}"))
    }

    #[test]
    fn group_roles_parse_and_refuse_what_is_not_a_mapping() {
        assert_eq!(
            line("ml=vision:member"),
            GroupRole { group: "ml".into(), tenant: TenantName::parse("vision").unwrap(), role: Role::Member }
        );
        // Group names may hold '=' (LDAP distinguished names); the last one splits.
        assert_eq!(line("cn=ml,ou=groups=vision:admin").group, "cn=ml,ou=groups");
        for bad in ["ml", "ml=vision", "=vision:member", "ml=vision:owner", "ml=Vision:member", "ml=:member"] {
            assert!(GroupRole::parse(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn the_highest_role_any_group_gives_wins_and_unmapped_groups_give_nothing() {
        let mapping = [line("readers=vision:viewer"), line("ml=vision:member"), line("leads=nlp:admin")];
        let groups = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let got = grants(&mapping, None, &groups(&["readers", "ml", "unrelated"]));
        assert_eq!(got.roles, BTreeMap::from([("vision".to_string(), Role::Member)]));
        assert_eq!(got.platform_admin, None);
        assert!(got.any());
        let none = grants(&mapping, Some("ops"), &groups(&["unrelated"]));
        assert!(none.roles.is_empty());
        assert_eq!(none.platform_admin, Some(false));
        assert!(!none.any());
        assert_eq!(grants(&mapping, Some("ops"), &groups(&["ops"])).platform_admin, Some(true));
    }

    #[test]
    fn groups_come_from_a_list_or_a_single_string() {
        assert_eq!(groups_of(Some(&serde_json::json!(["a", "b", 3]))), ["a", "b"]);
        assert_eq!(groups_of(Some(&serde_json::json!("a"))), ["a"]);
        assert!(groups_of(Some(&serde_json::json!({"a": 1}))).is_empty());
        assert!(groups_of(None).is_empty());
    }

    #[test]
    fn a_name_comes_from_preferred_username_else_a_verified_e_mail_only() {
        let claimed = |user: Option<&str>, email: Option<&str>, verified: Option<bool>| Claimed {
            preferred_username: user.map(str::to_string),
            email: email.map(str::to_string),
            email_verified: verified,
            groups: None,
        };
        let none = Claimed::default();
        assert_eq!(name_hint_of(&claimed(None, Some("a@x.org"), Some(true)), &none).as_deref(), Some("a@x.org"));
        assert_eq!(name_hint_of(&claimed(None, Some("a@x.org"), Some(false)), &none), None);
        assert_eq!(name_hint_of(&claimed(None, Some("a@x.org"), None), &none), None);
        // Userinfo fills what the ID token left out.
        assert_eq!(name_hint_of(&none, &claimed(Some("ada"), None, None)).as_deref(), Some("ada"));
        assert_eq!(
            name_hint_of(&claimed(None, Some("a@x.org"), Some(true)), &claimed(Some("ada"), None, None)).as_deref(),
            Some("ada")
        );
    }

    #[test]
    fn groups_merge_from_both_sources_and_scopes_parse_without_openid() {
        let with = |groups: Option<&[&str]>| Claimed {
            groups: groups.map(|g| g.iter().map(|s| s.to_string()).collect()),
            ..Claimed::default()
        };
        assert_eq!(
            groups_merged(&with(Some(&["b", "a"])), &with(Some(&["a", "c"]))),
            (vec!["a".into(), "b".into(), "c".into()], true)
        );
        assert_eq!(groups_merged(&with(None), &with(Some(&[]))), (vec![], true));
        assert_eq!(groups_merged(&with(None), &with(None)), (vec![], false));
        assert_eq!(scopes_of("openid profile,email  groups,groups"), ["profile", "email", "groups"]);
    }

    #[test]
    fn new_user_names_keep_to_the_user_name_rule() {
        assert_eq!(user_name_for(Some("ada.lovelace@example.org"), "s"), "ada.lovelace@example.org");
        assert_eq!(user_name_for(Some("-- Ada Lovelace!"), "s"), "AdaLovelace");
        let fallback = user_name_for(Some("日本"), "subject-1");
        assert!(fallback.starts_with("sso-") && fallback.len() == 16, "{fallback}");
        assert_eq!(fallback, user_name_for(None, "subject-1"));
        assert_eq!(user_name_for(Some(&"a".repeat(300)), "s").len(), 128);
    }
}
