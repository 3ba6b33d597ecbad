import { defineExampleSuite } from '../suites/example.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineExampleSuite(sqliteFixture);
