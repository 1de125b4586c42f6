// A real OpenID Connect provider for the single sign-on tests: npm's oidc-provider (an
// OpenID-Certified implementation: discovery, JWKS, the authorization code flow with PKCE,
// userinfo, RP-initiated logout), with a small control server beside it so that a test can
// choose who signs in next and what the provider releases, rotate the signing keys and tamper
// with an ID token in flight. Installed and pointed to by tests/ensure-oidc.
//
// The provider's own pages are replaced by an interaction that signs in the chosen account at
// once (and grants what is asked), so a browser or an HTTP client passes straight through; it
// counts the times it was asked to sign somebody in, which is what a person would see as a
// sign-in prompt.
//
// Prints one JSON line when ready: {"issuer": "...", "control": "http://127.0.0.1:PORT"}.
//
// Control (JSON bodies):
//   POST /client   {"redirect_uri", "post_logout_redirect_uri", "id_token_alg"?}: the relying
//                  party (Trainyard); id_token_alg "RS256" (default) or "EdDSA" (Ed25519)
//   POST /settings {"groups_scope"?: bool, "claims_in_id_token"?: bool, "clock_skew_s"?: n}:
//                  `groups` released only for a `groups` scope (else with `profile`); scope
//                  claims also in the ID token (else at userinfo only, as OIDC Core 5.4 has it,
//                  the provider's default); the provider's clock that many seconds ahead
//   POST /next     ... "userinfo_sub"? makes userinfo answer with that subject instead
//   POST /next     {"sub", "preferred_username"?, "email"?, "email_verified"?, "groups"?, ...}:
//                  the account the next sign-in prompt signs in (its claims are kept by sub)
//   POST /tamper   the next ID token leaves with its claims changed after signing
//   POST /rotate   a new RSA signing key, used for every ID token from now on: {"kid"}
//   GET  /last     the last ID token: {"kid", "alg", "claims"}
//   GET  /prompts  the sign-in prompts answered so far: {"login": N}
import crypto from 'node:crypto';
import http from 'node:http';

// Standard output carries the one ready line and is closed after it: the provider's notes go to
// standard error.
console.log = console.info = (...args) => console.error(...args);
const { default: Provider } = await import(process.env.OIDC_PROVIDER_ENTRY);

const jwk = (type, options, alg) => {
  const { privateKey } = crypto.generateKeyPairSync(type, options);
  return { ...privateKey.export({ format: 'jwk' }), kid: crypto.randomUUID(), alg, use: 'sig' };
};
let rsaKeys = [jwk('rsa', { modulusLength: 2048 }, 'RS256')];
const edKey = jwk('ed25519', {}, 'EdDSA');

const realNow = Date.now;
const accounts = new Map();
let nextSub = 'nobody';
let settings = { groups_scope: false, claims_in_id_token: false };
let client = null;
let tamperNext = false;
let last = { kid: null, alg: null, claims: null };
let logins = 0;

const unb64 = (part) => JSON.parse(Buffer.from(part, 'base64url').toString());
const b64 = (value) => Buffer.from(JSON.stringify(value)).toString('base64url');

const web = http.createServer((req, res) => handler(req, res));
await new Promise((resolve) => web.listen(0, '127.0.0.1', resolve));
const issuer = `http://127.0.0.1:${web.address().port}`;

let provider;
let handler = (req, res) => {
  res.statusCode = 503;
  res.end('no client registered yet');
};

// A fresh provider from the current settings (the stored sessions and grants outlive it).
function build() {
  const profile = ['name', 'preferred_username'];
  const claims = { openid: ['sub'], profile, email: ['email', 'email_verified'] };
  if (settings.groups_scope) claims.groups = ['groups'];
  else profile.push('groups');
  const clients = client
    ? [
        {
          client_id: 'trainyard',
          token_endpoint_auth_method: 'none',
          grant_types: ['authorization_code'],
          response_types: ['code'],
          redirect_uris: [client.redirect_uri],
          post_logout_redirect_uris: [client.post_logout_redirect_uri],
          id_token_signed_response_alg: client.id_token_alg ?? 'RS256',
        },
      ]
    : [];
  provider = new Provider(issuer, {
    clients,
    claims,
    scopes: ['openid', 'offline_access', ...Object.keys(claims).filter((s) => s !== 'openid')],
    conformIdTokenClaims: !settings.claims_in_id_token,
    jwks: { keys: [...rsaKeys, edKey] },
    cookies: { keys: ['trainyard-test-cookie-key'] },
    enabledJWA: { idTokenSigningAlgValues: ['RS256', 'EdDSA'] },
    features: { devInteractions: { enabled: false }, rpInitiatedLogout: { enabled: true } },
    interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
    findAccount: (ctx, sub) => ({
      accountId: sub,
      claims: () => {
        const { userinfo_sub: _, ...claims } = accounts.get(sub) ?? {};
        return { ...claims, sub };
      },
    }),
    // Everything asked is granted: the provider's consent page is not what is under test.
    loadExistingGrant: async (ctx) => {
      const grant = new ctx.oidc.provider.Grant({
        clientId: ctx.oidc.client.clientId,
        accountId: ctx.oidc.session.accountId,
      });
      grant.addOIDCScope([...ctx.oidc.requestParamScopes].join(' '));
      grant.addOIDCClaims(Object.keys(ctx.oidc.requestParamClaims ?? {}));
      await grant.save();
      return grant;
    },
  });
  provider.use(async (ctx, next) => {
    await next();
    // `userinfo_sub`: a provider gone wrong, whose userinfo speaks of somebody else.
    const other = ctx.path === '/me' && accounts.get(ctx.body?.sub)?.userinfo_sub;
    if (other) ctx.body = { ...ctx.body, sub: other };
    const idToken = ctx.path === '/token' ? ctx.body?.id_token : undefined;
    if (!idToken) return;
    const [header, payload, signature] = idToken.split('.');
    last = { kid: unb64(header).kid, alg: unb64(header).alg, claims: unb64(payload) };
    if (tamperNext) {
      tamperNext = false;
      // What an attacker between the browser and us would try: more groups, someone else.
      const claims = unb64(payload);
      claims.groups = [...(claims.groups ?? []), 'platform-admins', 'team-a-admins'];
      claims.sub = 'someone-else';
      ctx.body = { ...ctx.body, id_token: [header, b64(claims), signature].join('.') };
    }
  });
  const callback = provider.callback();
  handler = async (req, res) => {
    if (req.url.startsWith('/interaction/')) {
      try {
        const details = await provider.interactionDetails(req, res);
        const result = {};
        if (details.prompt.name === 'login') {
          logins += 1;
          result.login = { accountId: nextSub };
        }
        return await provider.interactionFinished(req, res, result, { mergeWithLastSubmission: true });
      } catch (err) {
        res.statusCode = 500;
        return res.end(String(err));
      }
    }
    return callback(req, res);
  };
}

const read = (req) =>
  new Promise((resolve) => {
    let body = '';
    req.on('data', (chunk) => (body += chunk));
    req.on('end', () => resolve(body ? JSON.parse(body) : {}));
  });

const control = http.createServer(async (req, res) => {
  const answer = (status, body) => {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body));
  };
  try {
    if (req.method === 'POST' && req.url === '/client') {
      client = await read(req);
      build();
      return answer(200, client);
    }
    if (req.method === 'POST' && req.url === '/settings') {
      settings = { ...settings, ...(await read(req)) };
      const skew = (settings.clock_skew_s ?? 0) * 1000;
      Date.now = () => realNow() + skew;
      build();
      return answer(200, settings);
    }
    if (req.method === 'POST' && req.url === '/next') {
      const { sub, ...claims } = await read(req);
      accounts.set(sub, claims);
      nextSub = sub;
      return answer(200, { sub });
    }
    if (req.method === 'POST' && req.url === '/tamper') {
      tamperNext = true;
      return answer(200, {});
    }
    if (req.method === 'POST' && req.url === '/rotate') {
      const key = jwk('rsa', { modulusLength: 2048 }, 'RS256');
      // The first key of a kind signs; the old one stays published.
      rsaKeys = [key, ...rsaKeys];
      build();
      return answer(200, { kid: key.kid });
    }
    if (req.method === 'GET' && req.url === '/last') return answer(200, last);
    if (req.method === 'GET' && req.url === '/prompts') return answer(200, { login: logins });
    answer(404, { error: 'unknown control' });
  } catch (err) {
    answer(500, { error: String(err) });
  }
});
await new Promise((resolve) => control.listen(0, '127.0.0.1', resolve));
process.stdout.write(JSON.stringify({ issuer, control: `http://127.0.0.1:${control.address().port}` }) + '\n');
process.on('SIGTERM', () => {
  web.close();
  control.close();
  process.exit(0);
});
