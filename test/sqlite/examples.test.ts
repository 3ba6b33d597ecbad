import { defineExamplesSuite } from '../suites/examples.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineExamplesSuite(sqliteFixture);
