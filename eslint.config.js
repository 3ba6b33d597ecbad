// ESLint: typescript-eslint's type-checked rules, plus the layer rules ARCHITECTURE.md describes.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

/** The repository areas (src/repositories/<area>.ts or <area>/): each imports shared/, never another area. */
const AREAS = [
  'dispatches',
  'gates',
  'locks',
  'maintenance',
  'messages',
  'org',
  'ownership',
  'paths',
  'runs',
  'scheduler',
  'tasks',
];
const areaImports = (prefix, except) =>
  AREAS.filter((area) => area !== except).flatMap((area) => [`${prefix}${area}.js`, `${prefix}${area}/*`]);
const AREA_MESSAGE = 'An area imports src/repositories/shared/, never another area (ARCHITECTURE.md).';
const DIALECT_MESSAGE =
  'Repositories use the dialect through StoreDialect (import types only); query helpers live in src/query/.';

export default tseslint.config(
  { ignores: ['dist/**', 'node_modules/**', 'coverage/**', '.tmp/**', '**/*.cjs', '**/*.mjs', 'eslint.config.js'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/switch-exhaustiveness-check': ['error', { considerDefaultExhaustiveForUnions: true }],
      // Kysely's Driver and DatabaseConnection are async interfaces; better-sqlite3 answers synchronously.
      '@typescript-eslint/require-await': 'off',
      // `Kysely<any>` is how Kysely spells a database-agnostic instance (migrations, introspection);
      // the no-unsafe-* rules still catch an `any` that flows somewhere.
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
    },
  },
  // Layers. domain/ is pure logic: no repositories, no dialects, no query layer.
  {
    files: ['src/domain/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              group: ['**/repositories/**', '**/dialects/**', '**/query/**', 'kysely', 'pg', 'better-sqlite3'],
              message: 'domain/ is pure logic: it imports neither repositories, dialects, the query layer nor drivers.',
            },
          ],
        },
      ],
    },
  },
  // The protocol strings (lock keys, wake-up topics) are the bottom layer: they import nothing.
  {
    files: ['src/protocol.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            { group: ['*'], message: 'src/protocol.ts holds strings every layer builds from: it imports nothing.' },
          ],
        },
      ],
    },
  },
  // Dialects sit below the repositories: they take protocol strings from src/protocol.ts, never a repository.
  {
    files: ['src/dialects/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              group: ['**/repositories/**'],
              message: 'A dialect never imports a repository (ARCHITECTURE.md, layers).',
            },
          ],
        },
      ],
    },
  },
  // Repositories import dialects as types only.
  {
    files: ['src/repositories/**/*.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        { patterns: [{ group: ['**/dialects/**'], allowTypeImports: true, message: DIALECT_MESSAGE }] },
      ],
    },
  },
  // Areas import shared/, never each other (src/repositories/index.ts assembles them).
  ...AREAS.flatMap((area) => [
    {
      files: [`src/repositories/${area}.ts`],
      rules: {
        'no-restricted-imports': ['error', { patterns: [{ group: areaImports('./', area), message: AREA_MESSAGE }] }],
      },
    },
    {
      files: [`src/repositories/${area}/**/*.ts`],
      rules: {
        'no-restricted-imports': ['error', { patterns: [{ group: areaImports('../', area), message: AREA_MESSAGE }] }],
      },
    },
  ]),
  {
    files: ['src/repositories/shared/**/*.ts', 'src/repositories/{context,validate,schema-guard,idempotent}.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        { patterns: [{ group: [...areaImports('./', ''), ...areaImports('../', '')], message: AREA_MESSAGE }] },
      ],
    },
  },
  // On Node 20 a literal that starts with a spread and sets keys after it (`{ ...row, receipt }`)
  // takes V8's slow path, 3.7 µs against 0.16 µs: the call paths copy with extend() (src/objects.ts).
  // The call paths: everything a store's calls run through. The CLI, doctor, inspect, the
  // dashboard and the migrator's planning build few objects per command and may spread.
  {
    files: [
      'src/repositories/**/*.ts',
      'src/query/**/*.ts',
      'src/transaction.ts',
      'src/dialects/**/*.ts',
      'src/events.ts',
      'src/store.ts',
      'src/otel/**/*.ts',
    ],
    rules: {
      'no-restricted-syntax': [
        'error',
        {
          selector: 'ObjectExpression > SpreadElement:first-child ~ Property',
          message: 'Copy with extend(base, { key }) from src/objects.ts: `{ ...base, key }` is slow on Node 20.',
        },
      ],
    },
  },
  // Tests, benchmarks and examples read raw rows and child-process messages: `any` is their daily bread.
  {
    files: ['test/**/*.ts', 'bench/**/*.ts', 'examples/**/*.ts', 'scripts/**/*.ts', 'vitest.config.ts'],
    rules: {
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      '@typescript-eslint/no-explicit-any': 'off',
    },
  },
);
