/**
 * Database URLs made safe to print, in every form a password can take in them:
 * - userinfo, with any characters in the password, an unencoded `@` or `/` included
 *   (`postgres://app:p@ss/word@db1/app` prints as `postgres://app:***@db1/app`);
 * - `password=` (and `sslpassword=`) in the query string, which pg accepts;
 * - libpq key/value strings (`host=db1 password='s3 cret' dbname=app`), quoted or not.
 * `secretsIn` lists the passwords themselves, so output can be scrubbed of them wherever they
 * turn up (an error message of a driver, `PGPASSWORD`): see `scrubSecrets`.
 */

const MASK = '***';
/** Parameters whose value is a secret, in a query string or a key/value string. */
const SECRET_KEYS = /^(password|sslpassword|passfile)$/i;
const KEY_VALUE = /(^|[\s&?;])(password|sslpassword)(\s*=\s*)('(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?|[^\s&]*)/gi;
/** What may follow the userinfo's `@`: a host list (`db1`, `[::1]:5432`, `a:1,b:2`), then `/`, `?`, `#` or the end. */
const HOST_LIKE = /^[A-Za-z0-9._~%\-[\]:,]*$/;

/**
 * The index of the `@` that ends the userinfo of `rest` (the URL after `scheme://`), or -1: the
 * last `@` followed by something host-like that is not inside the query string.
 */
function userinfoEnd(rest: string): number {
  for (let at = rest.lastIndexOf('@'); at >= 0; at = rest.lastIndexOf('@', at - 1)) {
    const after = rest.slice(at + 1).split(/[/?#]/, 1)[0]!;
    if (!HOST_LIKE.test(after)) continue;
    const query = rest.indexOf('?');
    // `?password=a@b`: an `@` after `?…=` is a query value, not the userinfo's end.
    if (query >= 0 && query < at && rest.slice(query, at).includes('=')) continue;
    return at;
  }
  return -1;
}

/** A database URL (or libpq key/value string) safe to print: every password replaced by `***`. */
export function redactDatabaseUrl(url: string): string {
  const scheme = /^([a-zA-Z][a-zA-Z0-9+.-]*:\/\/)/.exec(url);
  if (!scheme) return url.replace(KEY_VALUE, `$1$2$3${MASK}`);
  const rest = url.slice(scheme[1]!.length);
  const at = userinfoEnd(rest);
  let out = rest;
  if (at >= 0) {
    const userinfo = rest.slice(0, at);
    const colon = userinfo.indexOf(':');
    out = (colon >= 0 ? `${userinfo.slice(0, colon)}:${MASK}` : userinfo) + rest.slice(at);
  }
  return scheme[1]! + redactQuery(out);
}

function redactQuery(rest: string): string {
  const q = rest.indexOf('?');
  if (q < 0) return rest;
  const [query, ...fragment] = rest.slice(q + 1).split('#');
  const params = query!.split('&').map((pair) => {
    const eq = pair.indexOf('=');
    if (eq < 0) return pair;
    let key = pair.slice(0, eq);
    try {
      key = decodeURIComponent(key);
    } catch {
      // keep it as written
    }
    return SECRET_KEYS.test(key) ? `${pair.slice(0, eq)}=${MASK}` : pair;
  });
  return `${rest.slice(0, q)}?${params.join('&')}${fragment.length > 0 ? `#${fragment.join('#')}` : ''}`;
}

/**
 * The passwords in `url` (raw and percent-decoded), for scrubbing output of them. Empty strings
 * and one-character values are left out: they cannot be told apart from ordinary text.
 */
export function secretsIn(url: string): string[] {
  const found: string[] = [];
  const scheme = /^([a-zA-Z][a-zA-Z0-9+.-]*:\/\/)/.exec(url);
  if (scheme) {
    const rest = url.slice(scheme[1]!.length);
    const at = userinfoEnd(rest);
    if (at >= 0) {
      const userinfo = rest.slice(0, at);
      const colon = userinfo.indexOf(':');
      if (colon >= 0) found.push(userinfo.slice(colon + 1));
    }
    const q = rest.indexOf('?');
    if (q >= 0) {
      for (const pair of rest
        .slice(q + 1)
        .split('#')[0]!
        .split('&')) {
        const eq = pair.indexOf('=');
        if (eq >= 0 && SECRET_KEYS.test(safeDecode(pair.slice(0, eq)))) found.push(pair.slice(eq + 1));
      }
    }
  } else {
    for (const match of url.matchAll(KEY_VALUE)) found.push(match[4]!.replace(/^['"]|['"]$/g, ''));
  }
  const all = found.flatMap((s) => [s, safeDecode(s)]);
  return [...new Set(all)].filter((s) => s.length > 1);
}

function safeDecode(text: string): string {
  try {
    return decodeURIComponent(text.replace(/\+/g, ' '));
  } catch {
    return text;
  }
}

/** `text` with every occurrence of each secret replaced by `***` (longest first). */
export function scrubSecrets(text: string, secrets: readonly string[]): string {
  let out = text;
  for (const secret of [...secrets].sort((a, b) => b.length - a.length)) {
    if (secret.length > 1) out = out.split(secret).join(MASK);
  }
  return out;
}
