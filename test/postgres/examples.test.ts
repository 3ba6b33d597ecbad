import { defineExamplesSuite } from '../suites/examples.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineExamplesSuite(postgresFixture);
