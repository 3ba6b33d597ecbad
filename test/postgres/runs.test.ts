import { defineRunSuite } from '../suites/runs.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineRunSuite(postgresFixture);
