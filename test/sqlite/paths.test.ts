import { definePathLeaseSuite } from '../suites/paths.suite.js';
import { sqliteFixture } from '../support/dialects.js';

definePathLeaseSuite(sqliteFixture);
