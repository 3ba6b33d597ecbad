import { defineOwnershipSuite } from '../suites/ownership.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineOwnershipSuite(postgresFixture);
