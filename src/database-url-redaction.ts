/**
 * Database URLs made safe to print, in every form a password can take in them:
 * - userinfo, with any characters in the password, an unencoded `@`, `/`, `?` or `=` included
 *   (`postgres://app:p@ss/word@db1/app` prints as `postgres://app:***@db1/app`, and
 *   `postgres://app:a?b=c@db1/app` as `postgres://app:***@db1/app`);
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

/** A range of the URL after `scheme://` that holds a secret: `[start, end)`. */
interface Span {
  readonly start: number;
  readonly end: number;
}

/**
 * Where the secrets of `rest` (the URL after `scheme://`) are, redacting conservatively: a
 * password may hold any character unencoded (`@`, `/`, `?`, `=`), so
 * - the userinfo ends at the last `@` followed by something host-like, and everything between
 *   its first `:` and that `@` is the password (`u:a?b=c@h` masks `a?b=c`); an `@` with no `:`
 *   before it and a `/`, `?` or `#` is a query value's, not the userinfo's end;
 * - `password=` and `sslpassword=` values are read both from the first `?` (which may sit inside
 *   such a password) and from the first `?` after the userinfo, so a value holding an `@` is
 *   masked whole either way.
 * Where the two readings overlap, both are masked: a URL may lose more than its password, never less.
 */
function secretSpans(rest: string): Span[] {
  const spans: Span[] = [];
  let at = -1;
  for (let i = rest.lastIndexOf('@'); i >= 0; i = rest.lastIndexOf('@', i - 1)) {
    if (HOST_LIKE.test(rest.slice(i + 1).split(/[/?#]/, 1)[0]!)) {
      at = i;
      break;
    }
  }
  if (at >= 0) {
    const colon = rest.slice(0, at).indexOf(':');
    if (colon >= 0) spans.push({ start: colon + 1, end: at });
    else if (/[/?#]/.test(rest.slice(0, at))) at = -1;
  }
  for (const q of new Set([rest.indexOf('?'), at >= 0 ? rest.indexOf('?', at) : -1])) {
    if (q < 0) continue;
    const hash = rest.indexOf('#', q);
    let offset = q + 1;
    for (const pair of rest.slice(q + 1, hash < 0 ? rest.length : hash).split('&')) {
      const eq = pair.indexOf('=');
      if (eq >= 0 && SECRET_KEYS.test(safeDecode(pair.slice(0, eq))))
        spans.push({ start: offset + eq + 1, end: offset + pair.length });
      offset += pair.length + 1;
    }
  }
  return spans;
}

/** `spans` sorted, overlapping or touching ones merged: what is masked as one `***`. */
function merged(spans: readonly Span[]): Span[] {
  const out: Span[] = [];
  for (const span of [...spans].sort((a, b) => a.start - b.start)) {
    const last = out[out.length - 1];
    if (last && span.start <= last.end) out[out.length - 1] = { start: last.start, end: Math.max(last.end, span.end) };
    else out.push(span);
  }
  return out;
}

/** A database URL (or libpq key/value string) safe to print: every password replaced by `***`. */
export function redactDatabaseUrl(url: string): string {
  const scheme = /^([a-zA-Z][a-zA-Z0-9+.-]*:\/\/)/.exec(url);
  if (!scheme) return url.replace(KEY_VALUE, `$1$2$3${MASK}`);
  const rest = url.slice(scheme[1]!.length);
  let out = '';
  let from = 0;
  for (const span of merged(secretSpans(rest))) {
    out += rest.slice(from, span.start) + MASK;
    from = span.end;
  }
  return scheme[1]! + out + rest.slice(from);
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
    // Each reading's value, and the merged ranges (longest, so scrubbing replaces them first).
    const spans = secretSpans(rest);
    for (const span of [...spans, ...merged(spans)]) found.push(rest.slice(span.start, span.end));
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
