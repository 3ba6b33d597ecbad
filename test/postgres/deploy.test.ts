import { defineDeploySuite } from '../suites/deploy.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineDeploySuite(postgresFixture);
