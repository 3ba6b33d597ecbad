// Copies bench/results/latest.md into README.md between the BENCH markers (`npm run bench:readme`).
// Without both markers it refuses and writes nothing: what follows the start marker is then the
// README's own text (tables with hand-written readings), which a copy would overwrite.
import { readFileSync, writeFileSync } from 'node:fs';

const latest = readFileSync(new URL('./results/latest.md', import.meta.url), 'utf8')
  .replace(/^## .*\n/, '')
  .replace(/^### /gm, '#### ')
  .trim();
const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
const start = '<!-- BENCH TABLE -->';
const end = '<!-- /BENCH TABLE -->';
const from = readme.indexOf(start);
const to = readme.indexOf(end);
if (from < 0 || to < from) {
  console.error(
    `README.md has no ${start} … ${end} pair: nothing written. The benchmark figures there carry ` +
      'hand-written readings; update them from bench/results/ by hand, or put the pair around a ' +
      'block that may be replaced.',
  );
  process.exit(1);
}
const before = readme.slice(0, from + start.length);
const after = readme.slice(to);
writeFileSync(new URL('../README.md', import.meta.url), `${before}\n${latest}\n${after}`);
console.log('README benchmark table updated from bench/results/latest.md');
