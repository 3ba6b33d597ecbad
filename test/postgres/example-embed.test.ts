import { defineExampleSuite } from '../suites/example.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineExampleSuite(postgresFixture);
