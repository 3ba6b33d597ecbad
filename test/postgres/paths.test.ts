import { definePathLeaseSuite } from '../suites/paths.suite.js';
import { postgresFixture } from '../support/dialects.js';

definePathLeaseSuite(postgresFixture);
