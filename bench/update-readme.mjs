// Copies bench/results/latest.md into README.md between the BENCH markers (`npm run bench:readme`).
import { readFileSync, writeFileSync } from 'node:fs';

const latest = readFileSync(new URL('./results/latest.md', import.meta.url), 'utf8')
  .replace(/^## .*\n/, '')
  .replace(/^### /gm, '#### ')
  .trim();
const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
const start = '<!-- BENCH TABLE -->';
const end = '<!-- /BENCH TABLE -->';
const before = readme.slice(0, readme.indexOf(start) + start.length);
const after = readme.includes(end) ? readme.slice(readme.indexOf(end)) : `${end}\n`;
writeFileSync(new URL('../README.md', import.meta.url), `${before}\n${latest}\n${after}`);
console.log('README benchmark table updated from bench/results/latest.md');
