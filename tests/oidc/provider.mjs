// A real OpenID Connect provider for the single sign-on tests: npm's oauth2-mock-server (discovery,
// JWKS, authorization code flow with PKCE and nonce, RS256-signed ID tokens), with a small control
// server beside it so that a test can choose who signs in next, rotate the signing keys and tamper
// with an ID token in flight. Installed and pointed to by tests/ensure-oidc.
//
// Prints one JSON line when ready: {"issuer": "...", "control": "http://127.0.0.1:PORT"}.
//
// Control (JSON bodies):
//   POST /next    {"sub", "preferred_username", "email", "groups"}: the identity of the next sign-ins
//   POST /tamper  the next ID token leaves with its claims changed after signing (groups, subject)
//   POST /rotate  a new signing key, used for every ID token from now on: {"kid"}
//   GET  /last    the key id that signed the last ID token: {"kid"}
import http from 'node:http';

const { OAuth2Server } = await import(process.env.OAUTH2_MOCK_SERVER_ENTRY);

const server = new OAuth2Server();
await server.issuer.keys.generate('RS256');

let identity = { sub: 'nobody' };
let tamperNext = false;
let lastKid = null;

// Claims of the chosen identity on every token the provider signs.
server.service.on('beforeTokenSigning', (token) => {
  Object.assign(token.payload, identity);
});

const b64 = (value) => Buffer.from(JSON.stringify(value)).toString('base64url');
const unb64 = (part) => JSON.parse(Buffer.from(part, 'base64url').toString());

server.service.on('beforeResponse', (response) => {
  const idToken = response.body?.id_token;
  if (!idToken) return;
  const [header, payload, signature] = idToken.split('.');
  lastKid = unb64(header).kid;
  if (tamperNext) {
    tamperNext = false;
    // What an attacker between the browser and us would try: more groups, someone else.
    const claims = unb64(payload);
    claims.groups = [...(claims.groups ?? []), 'platform-admins', 'team-a-admins'];
    claims.sub = 'someone-else';
    response.body.id_token = [header, b64(claims), signature].join('.');
  }
});

const read = (req) =>
  new Promise((resolve) => {
    let body = '';
    req.on('data', (chunk) => (body += chunk));
    req.on('end', () => resolve(body ? JSON.parse(body) : {}));
  });

// Newest key last in the store; the token endpoint signs the access token and then the ID token
// with the keys in turn (round robin), so keep exactly the old and the new key: the ID token is
// signed with the new one.
let keyCount = 1;
const control = http.createServer(async (req, res) => {
  const answer = (status, body) => {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body));
  };
  try {
    if (req.method === 'POST' && req.url === '/next') {
      identity = await read(req);
      return answer(200, identity);
    }
    if (req.method === 'POST' && req.url === '/tamper') {
      tamperNext = true;
      return answer(200, {});
    }
    if (req.method === 'POST' && req.url === '/rotate') {
      if (keyCount !== 1) return answer(409, { error: 'rotate once per provider' });
      const key = await server.issuer.keys.generate('RS256');
      keyCount += 1;
      return answer(200, { kid: key.kid });
    }
    if (req.method === 'GET' && req.url === '/last') return answer(200, { kid: lastKid });
    answer(404, { error: 'unknown control' });
  } catch (err) {
    answer(500, { error: String(err) });
  }
});

await server.start(0, '127.0.0.1');
await new Promise((resolve) => control.listen(0, '127.0.0.1', resolve));
process.stdout.write(
  JSON.stringify({ issuer: server.issuer.url, control: `http://127.0.0.1:${control.address().port}` }) + '\n',
);
process.on('SIGTERM', async () => {
  await server.stop();
  control.close();
  process.exit(0);
});
