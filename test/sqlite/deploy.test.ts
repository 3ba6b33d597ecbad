import { defineDeploySuite } from '../suites/deploy.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineDeploySuite(sqliteFixture);
