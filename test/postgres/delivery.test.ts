import { defineDeliverySuite } from '../suites/delivery.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineDeliverySuite(postgresFixture);
